"""Smaller silent acceptances (issue 23, class 7) and the outside op suite's findings: sizes below
one byte, environment variables with values they cannot mean (each error names the variable),
``--timeout`` out of range, data-parallel ranks whose parameters have equal shapes in another
order; ``tril``/``triu`` of bools, ``flip`` with a repeated axis, integer powers, ``var``/``std``
with ``ddof`` at or above the count."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minicavs as mc
from minicavs.__main__ import main
from minicavs.errors import ArgumentError, DistributedError, ShapeError, ToolchainError
from minicavs.runtime import memory

from test_distributed import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}


# --- sizes ----------------------------------------------------------------------------------------

@given(number=st.decimals(min_value=0, max_value=10 ** 4, places=3, allow_nan=False),
       unit=st.sampled_from(sorted(UNITS)), suffix=st.sampled_from(["", "b", "ib"]))
def test_a_size_is_at_least_one_byte_or_refused(number, unit, suffix):
    text = f"{number}{unit}{suffix}"
    value = float(number) * UNITS[unit]
    try:
        parsed = memory.parse_size(text)
    except ArgumentError as exc:
        assert value < 1, f"{text!r} ({value} bytes) refused: {exc}"
        assert "at least 1" in str(exc)
        return
    assert parsed >= 1 and parsed == int(value), (text, parsed)


def test_half_a_byte_is_not_a_budget_of_zero():
    for text in ("0.5", "0.9", ".2", "0.0001k"):
        with pytest.raises(ArgumentError, match="memory budget"):
            mc.set_memory_budget(text)
    assert memory.parse_size("0.5k") == 512


# --- environment variables ------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0.5", "lots", "-1G"])
def test_a_bad_memory_budget_variable_is_named(monkeypatch, value):
    mc.set_memory_budget(None)
    monkeypatch.setenv("MINICAVS_MEMORY_BUDGET", value)
    with pytest.raises(ArgumentError, match="environment variable MINICAVS_MEMORY_BUDGET"):
        memory.memory_budget()


def _import_with(**env):
    return subprocess.run([sys.executable, "-c", "import minicavs.autodiff.debug as d; "
                           "print(d.enabled)"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))


@pytest.mark.parametrize("name, value", [("MINICAVS_DEBUG", "maybe"), ("MINICAVS_DEBUG", "2"),
                                         ("MINICAVS_DEVICE", "gpu")])
def test_a_bad_value_of_an_import_time_variable_names_it(name, value):
    done = _import_with(**{name: value})
    assert done.returncode != 0 and name in done.stderr and repr(value) in done.stderr, (
        done.stdout + done.stderr)


@pytest.mark.parametrize("value, on", [("off", "False"), ("No", "False"), ("yes", "True"),
                                       ("ON", "True")])
def test_minicavs_debug_takes_the_usual_spellings(value, on):
    done = _import_with(MINICAVS_DEBUG=value)
    assert done.returncode == 0 and done.stdout.strip() == on, done.stderr


def test_an_nvrtc_library_that_is_not_there_is_named(monkeypatch, tmp_path):
    from minicavs.cuda import nvrtc

    missing = str(tmp_path / "libnvrtc.so.12")
    monkeypatch.setenv("MINICAVS_NVRTC_LIB", missing)
    with pytest.raises(ToolchainError, match="MINICAVS_NVRTC_LIB"):
        nvrtc._candidate_libraries()


# --- --timeout --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_out_of_range_stops_the_job_before_it_starts(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "tree-lstm", "--timeout", value, "--sizes", "8,8,8"])
    assert info.value.code == 2 and "argument --timeout" in capsys.readouterr().err


# --- ranks whose parameters were made in another order ---------------------------------

@settings(max_examples=30, deadline=None)
@given(shapes=st.lists(st.sampled_from([(2, 3), (3,), (2, 3)]), min_size=2, max_size=5),
       order=st.randoms(use_true_random=False), pairs=st.booleans())
def test_ranks_pair_parameters_by_name_whatever_order_they_were_made_in(shapes, order, pairs):
    names = [f"layer{i}.weight" for i in range(len(shapes))]
    permutation = list(range(len(shapes)))
    order.shuffle(permutation)

    def work(comm):
        rng = np.random.default_rng(comm.rank)
        mine = permutation if comm.rank == 1 else list(range(len(shapes)))
        params = [mc.Parameter(rng.standard_normal(shapes[i]), name=None if pairs else names[i])
                  for i in mine]
        comm.broadcast_parameters([(names[i], p) for i, p in zip(mine, params)] if pairs
                                  else params)
        return {names[i]: p.numpy() for i, p in zip(mine, params)}

    (first, second), _ = run_ranks(2, work)
    for name in names:  # each has rank 0's value of the same name, never a namesake's by place
        np.testing.assert_array_equal(first[name], second[name])


# --- the outside op suite -----------------------------------------------------------------------

@given(rows=st.integers(1, 5), columns=st.integers(1, 5), k=st.integers(-5, 5),
       seed=st.integers(0, 99), batch=st.integers(0, 2))
def test_tril_and_triu_of_bools_stay_bool(rows, columns, k, seed, batch):
    x = np.random.default_rng(seed).integers(0, 2, (batch, rows, columns)[(0 if batch else 1):]
                                             ).astype(bool)
    for mine, numpy in ((mc.tril, np.tril), (mc.triu, np.triu)):
        out = mine(mc.tensor(x), k)
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out.numpy(), numpy(x, k))


@given(ndim=st.integers(1, 4), data=st.data())
def test_flip_refuses_a_repeated_axis_and_matches_numpy_otherwise(ndim, data):
    axes = data.draw(st.lists(st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim + 1))
    x = np.arange(np.prod(range(2, ndim + 2))).reshape(range(2, ndim + 2))
    if len({a % ndim for a in axes}) < len(axes):
        with pytest.raises(ShapeError, match="repeated axis"):
            mc.flip(mc.tensor(x), tuple(axes))
    else:
        np.testing.assert_array_equal(mc.flip(mc.tensor(x), tuple(axes)).numpy(),
                                      np.flip(x, tuple(axes)))


@given(dtype=st.sampled_from(["int32", "int64", "uint8", "bool"]), exponent=st.integers(-4, 4),
       as_float=st.booleans(), seed=st.integers(0, 99))
def test_integer_powers_follow_numpy(dtype, exponent, as_float, seed):
    x = np.random.default_rng(seed).integers(1, 4, 5).astype(dtype)
    power = float(exponent) if as_float else exponent
    if exponent < 0 and not as_float:
        with pytest.raises(ArgumentError, match="negative integer power"):
            mc.tensor(x) ** power
        with pytest.raises((ValueError, OverflowError)):  # NumPy refuses it too
            np.power(x if dtype != "bool" else x.astype(int), power)
        return
    out = mc.tensor(x) ** power
    want = np.power(x.astype(np.float64) if as_float else x, power)
    assert (np.dtype(out.dtype).kind == "f") == as_float, (out.dtype, power)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), extra=st.integers(0, 2),
       equal=st.booleans(), seed=st.integers(0, 99))
def test_var_and_std_with_ddof_at_or_above_the_count_divide_by_zero(shape, extra, equal, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    if equal:
        x = np.ones(shape)
    ddof = x.size + extra - (1 if extra == 2 else 0)  # the count, or one or two more
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy warns too: no degrees left
        want = np.var(x, ddof=ddof)
        got_var = mc.tensor(x).var(ddof=ddof).numpy()
        got_std = mc.tensor(x).std(ddof=ddof).numpy()
    np.testing.assert_array_equal(got_var, want)  # inf, or NaN where x is constant
    np.testing.assert_array_equal(got_std, np.sqrt(want))
