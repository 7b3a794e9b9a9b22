"""The hand-written product kernels on every instruction set, and the calibration that picks
between them and NumPy's BLAS (``minicavs/cpu/isa.py``, ``calibrate.py``, ``kernels.py``).

Every variant is compiled into the one kernels library everywhere (x86), so a variant this CPU
cannot run is still checked to compile; each variant this CPU runs is forced
(``MINICAVS_CPU_TARGET``) and checked against NumPy. No timing is asserted: speed is in
``benchmarks/kernels.py``."""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from minicavs.cpu import blas, build, calibrate, isa, kernels, products, team
from minicavs.errors import ArgumentError

needs_native = pytest.mark.skipif(build.unavailable() is not None,
                                  reason="no native code here (no compiler, or switched off)")


def _skip_unless_runs(target):
    if not isa.runs_here(target):
        pytest.skip(f"the {target} variant is compiled (test_every_variant_is_compiled) but "
                    f"runs only on a CPU with {', '.join(isa.TARGETS[target].needs)}; this one "
                    f"lacks it")


@needs_native
def test_every_variant_is_compiled_into_the_kernels_library():
    """The library holds each target's panel kernels (on x86 the AVX-512 one too, compiled
    with ``#pragma GCC target("avx512f")`` whatever this CPU has)."""
    lib = kernels.library()
    for target in isa.TARGETS:
        if isa.TARGETS[target].pragma and not isa.x86():
            continue
        for suffix in ("f32", "f64"):
            for kernel in ("packed_gemm", "pack_panels", "panel_width"):
                assert hasattr(lib, f"{target}_{kernel}_{suffix}"), (target, kernel)
        width = getattr(lib, f"{target}_panel_width_f32")()
        assert width == isa.TARGETS[target].vectors * isa.TARGETS[target].vector // 4


@needs_native
@pytest.mark.parametrize("target", list(isa.TARGETS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_each_variants_panels_equal_numpy(monkeypatch, target, dtype):
    """Forced to one variant and to the library's own kernels: products with an invariant
    weight and with its transpose, every row tail of the register block, a last panel cut
    short, strided rows and a given ``out``, equal NumPy's in float64."""
    _skip_unless_runs(target)
    monkeypatch.setenv(isa.ENVIRONMENT, target)
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    rng = np.random.default_rng(7)
    W = rng.standard_normal((200, 333)).astype(dtype)  # 333: no panel width divides it
    wide = rng.standard_normal((40, 500)).astype(dtype)
    tol = 1e-12 if dtype == "float64" else 3e-5
    with products.team_products(), products.invariant_operands([W]):
        for m in range(1, 15):
            for x, w in ((wide[:m, :200], W), (wide[:m, :333], W.T)):
                got = products.packed_matmul(x, w)
                assert got is not None, (m, w.shape)
                expect = x.astype(np.float64) @ w.astype(np.float64)
                np.testing.assert_allclose(got, expect, rtol=tol, atol=tol * 30)
        out = np.full((9, 333), np.nan, dtype)
        assert products.matmul(wide[:9, :200], W, out) is out
        np.testing.assert_allclose(out, wide[:9, :200].astype(np.float64) @ W, rtol=tol,
                                   atol=tol * 30)


def test_the_target_is_the_widest_the_cpu_runs_unless_forced(monkeypatch):
    monkeypatch.delenv(isa.ENVIRONMENT, raising=False)
    assert isa.target() == next(t for t in isa.TARGETS if isa.runs_here(t))
    assert isa.runs_here("portable")
    monkeypatch.setenv(isa.ENVIRONMENT, "portable")
    assert isa.target() == "portable"
    monkeypatch.setenv(isa.ENVIRONMENT, "sse9")
    with pytest.raises(ArgumentError, match="MINICAVS_CPU_TARGET='sse9' is not one of"):
        isa.target()
    lacking = [t for t in isa.TARGETS if not isa.runs_here(t)]
    if lacking:  # forcing what the CPU lacks is an error, not an illegal instruction
        monkeypatch.setenv(isa.ENVIRONMENT, lacking[0])
        with pytest.raises(ArgumentError, match="this CPU lacks"):
            isa.target()


def test_the_generated_code_prefers_wide_vectors_only_for_the_avx512_target(monkeypatch):
    monkeypatch.setenv(isa.ENVIRONMENT, "portable")
    build.cxx_flags.cache_clear()
    try:
        assert not any("vector-width" in flag for flag in build.cxx_flags())
    finally:
        build.cxx_flags.cache_clear()


@needs_native
def test_forced_choices_pick_the_blas_or_the_own_kernels(monkeypatch):
    """``MINICAVS_KERNELS=blas`` leaves every product to NumPy; ``own`` runs the panels and the
    team wherever they apply (values equal NumPy's); another value is an error."""
    rng = np.random.default_rng(8)
    W = rng.standard_normal((64, 96))
    x = rng.standard_normal((5, 64))
    monkeypatch.setenv(calibrate.ENVIRONMENT, "blas")
    with products.team_products(), products.invariant_operands([W]):
        assert products.matmul(x, W) is None
        assert products.team_matmul(x, W) is None
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    with products.team_products(), products.invariant_operands([W]):
        np.testing.assert_allclose(products.packed_matmul(x, W), x @ W, rtol=1e-12)
        if products.team_ready():
            np.testing.assert_allclose(products.team_matmul(x, W.T.copy().T), x @ W, rtol=1e-12)
    # Inside a call's block the value it began with holds (read once: it is asked hundreds of
    # times a step); the next block reads it again
    with products.team_products():
        monkeypatch.setenv(calibrate.ENVIRONMENT, "blas")
        assert calibrate.forced() == "own"
    assert calibrate.forced() == "blas"
    monkeypatch.setenv(calibrate.ENVIRONMENT, "fastest")
    with pytest.raises(ArgumentError, match="MINICAVS_KERNELS"):
        calibrate.forced()
    with pytest.raises(ArgumentError, match="MINICAVS_KERNELS"):  # (before the block starts:
        with products.team_products():  # nothing of this thread's state changed)
            pass
    assert not getattr(products._team, "on", False) and \
        getattr(products._team, "kernels", None) is None


@needs_native
def test_a_blocks_routes_follow_the_operands(monkeypatch):
    """``products.matmul`` decides the route of each layout of operands once per block and looks
    it up after: new values in the same layouts, another matrix of the weight's layout (not
    invariant: never the weight's panels), a nested block's new invariant operand, and four
    threads at once, each with its own weight, all equal NumPy's product."""
    from threads import run_in_threads

    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")  # the panels wherever they apply
    rng = np.random.default_rng(12)
    W, V = rng.standard_normal((64, 96)), rng.standard_normal((64, 96))
    ran = []
    real = products._Panels.run
    monkeypatch.setattr(products._Panels, "run",
                        lambda panels, a, out=None: ran.append(panels.b) or real(panels, a, out))

    def check(got, x, y):
        if got is not None:
            np.testing.assert_allclose(got, x @ y, rtol=1e-12, atol=1e-12)

    with products.team_products(), products.invariant_operands([W]):
        for _ in range(3):
            x, other = rng.standard_normal((5, 64)), V.copy()
            check(products.matmul(x, W), x, W)
            check(products.matmul(x, other), x, other)
            check(products.matmul(x.T.copy(), W.T), x.T.copy(), W.T)
        check(products.matmul(x, V), x, V)  # (V is no weight here)
        assert ran and all(b is W for b in ran)
        with products.invariant_operands([V]):
            check(products.matmul(x, V), x, V)
            assert ran[-1] is V
        count = len(ran)
        check(products.matmul(x, V), x, V)  # (V's panels went with the nested block)
        assert all(b is not V for b in ran[count:])

    def work(k):
        own = np.random.default_rng(k).standard_normal((64, 96))
        with products.team_products(), products.invariant_operands([own]):
            for rows in (1, 3, 5, 3, 1):
                x = np.random.default_rng(k + rows).standard_normal((rows, 64))
                check(products.matmul(x, own), x, own)
    run_in_threads(work, 4)


@needs_native
def test_a_large_product_outside_a_call_runs_on_the_team_where_it_wins(monkeypatch):
    """Outside a call of native loops (the user's own ops), a product of at least
    ``products.LARGE`` multiply-adds runs on a team of the free cores where that measured
    faster than NumPy's BLAS (forced here), in every layout; smaller ones, or with the BLAS
    chosen, stay NumPy's."""
    if not products.team_ready():
        pytest.skip("no team here (one core, or no CBLAS gemm)")
    monkeypatch.setattr(calibrate, "free_cores", lambda: 2)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 300)), rng.standard_normal((300, 260))
    assert 256 * 300 * 260 >= products.LARGE
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    for x, y in ((a, b), (a.T.copy().T, b), (a, b.T.copy().T)):
        np.testing.assert_allclose(products.matmul(x, y), a @ b, rtol=1e-12, atol=1e-10)
    assert products.matmul(a[:8], b) is None  # (small: NumPy's)
    monkeypatch.setenv(calibrate.ENVIRONMENT, "blas")
    assert products.matmul(a, b) is None


@needs_native
def test_the_teams_verdict_is_kept_per_weight_shape_and_few_rows(monkeypatch):
    """A weight's product gets the verdict measured at its own shape, a few rows by their
    count (more by bucket): 4 x 256 x 640 and 4 x 256 x 1024 lie in one bucket of all three
    sizes, where OpenBLAS runs the first on its small-matrix kernel 8x faster a flop, and its
    time jumps between 3 and 4 rows; Xᵀ·G, whose inner size is a batch's rows, keeps one
    verdict for rows of one bucket (so do ones·G's sums)."""
    if not products.team_ready():
        pytest.skip("no team here (one core, or no CBLAS gemm)")
    monkeypatch.delenv(calibrate.ENVIRONMENT, raising=False)
    monkeypatch.setattr(calibrate, "free_cores", lambda: 2)
    monkeypatch.setattr(products, "_wins", {})
    asked = []

    def own_is_faster(name, make, *args, **kwargs):
        if not name.startswith("team"):  # (the gemm's own choice: MKL where installed)
            return False
        asked.append(name)
        return "640" in name  # (the team for one weight, NumPy for the other)
    monkeypatch.setattr(calibrate, "own_is_faster", own_is_faster)
    rng = np.random.default_rng(1)
    with products.team_products():
        for m, n in ((3, 640), (4, 640), (4, 1024), (3, 1024)):
            x, w = rng.standard_normal((m, 256)), rng.standard_normal((256, n))
            assert products._team_wins(x, w) is (n == 640)
        for rows in (900, 1000):  # (Xᵀ·G: 900 and 1000 rows, one bucket)
            x, g = rng.standard_normal((rows, 64)), rng.standard_normal((rows, 80))
            products._team_wins(x.T, g)
    assert asked == ["team f64 3x640x<=256 (2 threads)", "team f64 4x640x<=256 (2 threads)",
                     "team f64 4x1024x<=256 (2 threads)", "team f64 3x1024x<=256 (2 threads)",
                     "team f64 <=64x80x<=1024 Aᵀ (2 threads)"]


@needs_native
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_product_with_the_longest_inner_dimension_splits_it_on_the_team(monkeypatch, dtype):
    """Where k is a product's longest side (a parameter's gradient Xᵀ·G), the team may split k
    (forced here), each thread's partial sum added into the out: values equal NumPy's in
    every layout, for an even and an odd k."""
    if not products.team_ready():
        pytest.skip("no team here (one core, or no CBLAS gemm)")
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    rng = np.random.default_rng(6)
    tol = 1e-12 if dtype == "float64" else 3e-5
    for m, k, n in ((24, 1001, 40), (33, 700, 9)):
        a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        expect = a.astype(np.float64) @ b.astype(np.float64)
        for x, y in ((a, b), (a.T.copy().T, b), (a, b.T.copy().T), (a.T.copy().T, b.T.copy().T)):
            with products.team_products():
                got = products.team_matmul(x, y)
            np.testing.assert_allclose(got, expect, rtol=tol, atol=tol * 100)
    assert any(key[0] == "k" and won for key, won in products._wins.items())


@pytest.fixture
def fresh_calibration(monkeypatch, tmp_path):
    """Calibration in an empty cache folder, this process's measurements forgotten."""
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(calibrate.ENVIRONMENT, raising=False)
    monkeypatch.setattr(calibrate, "free_cores", lambda: 64)
    calibrate.path.cache_clear()
    monkeypatch.setattr(calibrate, "_table", None)
    monkeypatch.setattr(calibrate, "_looked_here", set())
    monkeypatch.setattr(calibrate, "_unsaved", {})  # (a test's are never written elsewhere)
    # (never written yet: the first measurement is written at once, whatever SAVE_EVERY a test
    # sets; -SAVE_EVERY was that only on a machine up for longer than the test's SAVE_EVERY)
    monkeypatch.setattr(calibrate, "_saved_at", float("-inf"))
    yield tmp_path
    calibrate.path.cache_clear()


def test_a_choice_is_measured_once_kept_on_disk_and_read_back(fresh_calibration, monkeypatch):
    calls = []
    slow = lambda: sum(range(20000))  # noqa: E731
    fast = lambda: calls.append(1)  # noqa: E731
    assert calibrate.own_is_faster("demo", lambda: (fast, slow)) is True
    assert calibrate.own_is_faster("demo2", lambda: (slow, fast)) is False
    measured = len(calls)
    assert measured >= 1 + calibrate.ROUNDS[0]  # a warm-up, then timed rounds
    calibrate.flush()
    with open(calibrate.path()) as f:
        stored = json.load(f)
    assert set(stored) == {"demo", "demo2"} and stored["demo"][0] < stored["demo"][1]
    monkeypatch.setattr(calibrate, "_table", None)  # as a new process: read, not measured
    monkeypatch.setattr(calibrate, "measure", lambda *calls: pytest.fail("measured again"))
    assert calibrate.own_is_faster("demo", lambda: pytest.fail("set up again")) is True
    assert calibrate.measured() == {name: t[:2] for name, t in stored.items()}
    assert stored["demo2"][2] == 2  # (a loss: looked at twice)


def test_the_own_kernel_must_win_by_the_margin_and_by_more_than_the_timers_jitter():
    us = 1e-6
    assert calibrate.wins((50 * us, 100 * us)) and calibrate.wins((7 * us, 10 * us))
    assert not calibrate.wins((97 * us, 100 * us))  # (within MARGIN: equal within the noise)
    # a 14 % gain of 1.7 us: the level loop's panels of 2 x 256 x 640 read so at one look,
    # then timed at 14 us against the gemm's 11 beside it
    assert not calibrate.wins((9.9 * us, 11.6 * us))
    assert not calibrate.wins((10 * us, 9 * us))


def test_a_close_call_is_measured_again_now_and_once_more_by_a_later_process(
        fresh_calibration, monkeypatch):
    """Own ÷ BLAS within ``CLOSE``, or a loss: measured a second time at once, the best of both
    decides and is kept; still close (or lost), a later process looks a third time (two looks a
    moment apart can both be disturbed), and none a fourth — unless it is a team against one
    thread still close: every later process looks once more until it is not; one that the
    second look settles is not measured again. A clear win is looked at once more, by a later
    process (a slow moment of the BLAS side made one), and then not again."""
    def new_process():  # (after this one's exit, which writes what it measured)
        calibrate.flush()
        monkeypatch.setattr(calibrate, "_table", None)
        monkeypatch.setattr(calibrate, "_looked_here", set())

    def measures(*results):
        results = iter(results)
        monkeypatch.setattr(calibrate, "measure", lambda *calls: next(results))

    def no_measure():
        monkeypatch.setattr(calibrate, "measure", lambda *calls: pytest.fail("measured again"))

    def kept(name):  # (the file: the times and how many looks they took)
        calibrate.flush()
        with open(calibrate.path()) as f:
            return json.load(f)[name]

    measures([52.6, 53.8], [53.0, 54.0])  # both looks disturbed: still close, the BLAS kept
    assert calibrate.own_is_faster("team Aᵀ", lambda: (None, None)) is False
    assert kept("team Aᵀ") == [52.6, 53.8, 2]
    no_measure()  # (not a third time in the process that took the first two)
    assert calibrate.own_is_faster("team Aᵀ", lambda: (None, None)) is False
    new_process()
    measures([27.0, 54.0])
    assert calibrate.own_is_faster("team Aᵀ", lambda: (None, None)) is True
    assert kept("team Aᵀ") == [27.0, 53.8, 3]
    new_process()
    no_measure()
    assert calibrate.own_is_faster("team Aᵀ", lambda: (None, None)) is True

    measures([52.6, 53.8], [30.0, 54.0])  # (the team was slow the first time)
    assert calibrate.own_is_faster("team Xᵀ·G", lambda: (None, None)) is True
    assert kept("team Xᵀ·G") == [30.0, 53.8, 2]
    new_process()
    no_measure()
    assert calibrate.own_is_faster("team Xᵀ·G", lambda: (None, None)) is True
    measures([10.0, 30.0])
    assert calibrate.own_is_faster("clear", lambda: (None, None)) is True
    no_measure()
    assert calibrate.own_is_faster("clear", lambda: (None, None)) is True
    new_process()  # a clear win at one look: a later process looks once more
    measures([12.0, 16.0])
    assert calibrate.own_is_faster("clear", lambda: (None, None)) is True
    assert kept("clear") == [10.0, 16.0, 2]
    new_process()
    no_measure()
    assert calibrate.own_is_faster("clear", lambda: (None, None)) is True
    measures([17.0, 27.0])  # the BLAS side timed in a slow moment: a clear win, at first
    assert calibrate.own_is_faster("panels 4", lambda: (None, None)) is True
    new_process()
    measures([19.0, 16.0])
    assert calibrate.own_is_faster("panels 4", lambda: (None, None)) is False
    assert kept("panels 4") == [17.0, 16.0, 2]
    measures([38.0, 28.8], [12.0, 28.0])  # a loss is looked at again: a busy moment's
    assert calibrate.own_is_faster("team Bᵀ", lambda: (None, None)) is True
    assert kept("team Bᵀ") == [12.0, 28.0, 2]
    measures([30.0, 10.0], [31.0, 10.5])  # a real loss: the BLAS kept, a third look later
    assert calibrate.own_is_faster("panels", lambda: (None, None)) is False
    new_process()
    measures([29.0, 10.0])
    assert calibrate.own_is_faster("panels", lambda: (None, None)) is False
    assert kept("panels") == [29.0, 10.0, 3]
    new_process()
    no_measure()  # (a loss: three looks are enough)
    assert calibrate.own_is_faster("panels", lambda: (None, None)) is False
    measures([10.0, 10.2], [10.1, 10.3])  # two choices on the same cores, close
    assert calibrate.own_is_faster("panels or team", lambda: (None, None)) is False
    new_process()
    measures([10.05, 10.1])
    assert calibrate.own_is_faster("panels or team", lambda: (None, None)) is False
    new_process()
    no_measure()  # (close as it says: not a fourth look)
    assert calibrate.own_is_faster("panels or team", lambda: (None, None)) is False

    def team_joined():
        return calibrate.own_is_faster("team joined", lambda: (None, None), 2, against_one=True)
    measures([10.9, 11.2], [11.0, 11.3])  # every look in a slow minute: close after two
    assert team_joined() is False
    for looks in (3, 4):  # a team against one thread, still close: each process looks again
        new_process()
        measures([11.5, 11.4])
        assert team_joined() is False
        no_measure()  # (once a process)
        assert team_joined() is False
        assert kept("team joined") == [10.9, 11.2, looks]
    new_process()
    measures([7.0, 13.8])  # a quiet look: the team twice as fast
    assert team_joined() is True
    assert kept("team joined") == [7.0, 11.2, 5]
    new_process()
    no_measure()  # (not close any more)
    assert team_joined() is True


@needs_native
def test_the_library_gemm_is_mkls_only_where_measured_faster_a_loss_looked_at_twice(
        fresh_calibration, monkeypatch):
    """The level loops and the team's products call MKL's gemm where it is installed and
    measured faster here than NumPy's BLAS, else NumPy's; a loss is measured once more before
    NumPy's is kept. (MKL stood in for by NumPy's own CBLAS gemm: the choice, not MKL, is
    checked here; the next test runs MKL where it is installed.)"""
    numpy_gemm = blas.gemm("float32")
    if not numpy_gemm[1].startswith("cblas"):
        pytest.skip("NumPy's BLAS has no CBLAS gemm here (SciPy's Fortran one is used)")
    stand_in = numpy_gemm  # (called only if the stubbed measure below were not)
    monkeypatch.setattr(blas, "mkl_gemm", lambda dtype, routine="gemm": stand_in)
    monkeypatch.setattr(blas, "mkl_identity", lambda: "stand-in MKL")
    looks = []

    def choose(*results):
        calibrate._mkl_chosen.cache_clear()
        calibrate._gemm.cache_clear()
        monkeypatch.setattr(calibrate, "_table", None)
        monkeypatch.setattr(calibrate, "_looked_here", set())
        calibrate._unsaved.clear()
        if os.path.exists(calibrate.path()):
            os.remove(calibrate.path())
        results = iter(results)
        monkeypatch.setattr(calibrate, "measure",
                            lambda *calls: looks.append(calls) or next(results))
        return calibrate.gemm("float32")

    try:
        assert choose([1.0, 2.0]) == stand_in + ("MKL",) and len(looks) == 1
        assert choose([2.0, 1.0], [2.0, 1.0]) == numpy_gemm + ("NumPy's BLAS",)
        assert len(looks) == 3  # (the loss measured twice)
        assert choose([2.0, 1.0], [0.5, 1.0]) == stand_in + ("MKL",)  # a disturbed first look
        monkeypatch.setattr(blas, "mkl_gemm", lambda dtype, routine="gemm": None)  # not installed
        assert choose() == numpy_gemm + ("NumPy's BLAS",)
    finally:
        calibrate._mkl_chosen.cache_clear()
        calibrate._gemm.cache_clear()


@needs_native
@pytest.mark.skipif(blas.mkl() is None, reason="MKL is not installed here (pip install mkl; "
                    "the [test] extra has it on x86-64)")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mkls_gemm_equals_numpy_and_leaves_numpys_blas_alone(monkeypatch, dtype):
    """Forced (``MINICAVS_KERNELS=own``) to MKL: one-thread products in every layout and the
    team's equal NumPy's; NumPy's own products still run its BLAS (MKL is loaded with local
    symbols, on its sequential layer)."""
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    address, interface, name = calibrate.gemm(dtype)
    assert name == "MKL" and (address, interface) == blas.mkl_gemm(dtype)
    assert blas.gemm(dtype)[0] != address
    rng = np.random.default_rng(3)
    tol = 1e-12 if dtype == "float64" else 3e-5
    for m, k, n in ((1, 7, 5), (33, 64, 130), (300, 17, 9)):
        for a in (rng.standard_normal((m, k)).astype(dtype),
                  rng.standard_normal((k, m)).astype(dtype).T):
            for b in (rng.standard_normal((k, n)).astype(dtype),
                      rng.standard_normal((n, k)).astype(dtype).T):
                out = np.full((m, n), np.nan, dtype)
                calibrate.one_thread_gemm((address, interface), a, b, out)()
                expect = a.astype(np.float64) @ b.astype(np.float64)
                np.testing.assert_allclose(out, expect, rtol=tol, atol=tol * 30)
                if products.team_ready():
                    with products.team_products():
                        np.testing.assert_allclose(products.team_matmul(a, b), expect,
                                                   rtol=tol, atol=tol * 30)


def test_a_kernel_whose_source_changed_is_measured_again(fresh_calibration):
    made = []

    def make():
        made.append(1)
        return (lambda: None), (lambda: sum(range(20000)))
    assert calibrate.own_is_faster("conv", make, source="kernel v1") is True
    assert calibrate.own_is_faster("conv", make, source="kernel v1") is True
    assert len(made) == 1
    calibrate.own_is_faster("conv", make, source="kernel v2")  # an edited kernel
    assert len(made) == 2
    assert list(calibrate.measured()) == ["conv"]  # (named without the source's digest)
    calibrate.flush()
    with open(calibrate.path()) as f:
        assert len(json.load(f)) == 1  # the first source's measurement is gone


def test_measurements_are_not_kept_while_other_work_holds_their_cores(fresh_calibration,
                                                                      monkeypatch):
    monkeypatch.setattr(calibrate, "free_cores", lambda: 1)
    fast, slow = (lambda: None), (lambda: sum(range(20000)))
    assert calibrate.own_is_faster("team", lambda: (fast, slow), threads=2) is True
    assert not os.path.exists(calibrate.path())
    assert "team" in calibrate.measured()  # (this process still uses it)
    calibrate.own_is_faster("one thread", lambda: (fast, slow), threads=1)
    calibrate.flush()
    with open(calibrate.path()) as f:
        assert list(json.load(f)) == ["one thread"]


def test_a_burst_of_measurements_is_written_once_and_the_rest_at_exit(fresh_calibration,
                                                                     monkeypatch):
    """The first measurement is written at once; those a moment after it (a workload's first
    steps measure dozens of buckets) wait for the next write, made at most every
    ``SAVE_EVERY`` seconds, by :func:`flush` or at the process's exit."""
    monkeypatch.setattr(calibrate, "SAVE_EVERY", 3600.0)
    monkeypatch.setattr(calibrate, "measure", lambda *calls: [1.0, 2.0])

    def stored():
        with open(calibrate.path()) as f:
            return set(json.load(f))
    for name in ("a", "b", "c"):
        assert calibrate.own_is_faster(name, lambda: (None, None)) is True
    assert stored() == {"a"}
    assert set(calibrate.measured()) == {"a", "b", "c"}  # (this process uses all three)
    calibrate.flush()
    assert stored() == {"a", "b", "c"}
    monkeypatch.setattr(calibrate, "SAVE_EVERY", 0.0)  # (the next one writes the file at once)
    calibrate.own_is_faster("d", lambda: (None, None))
    assert stored() == {"a", "b", "c", "d"}

    code = ("from minicavs.cpu import calibrate\n"
            "calibrate.free_cores = lambda: 64\n"
            "calibrate.measure = lambda *calls: [1.0, 2.0]\n"
            "for name in ('e', 'f'):\n"
            "    calibrate.own_is_faster(name, lambda: (None, None))\n"
            "assert calibrate._unsaved, 'f was written at once: nothing left for the exit'\n")
    env = dict(os.environ, MINICAVS_CACHE_DIR=str(fresh_calibration))
    env.pop(calibrate.ENVIRONMENT, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert stored() == {"a", "b", "c", "d", "e", "f"}


def test_a_measurement_that_cannot_be_written_decides_for_this_process_and_leaves_nothing(
        fresh_calibration, monkeypatch):
    """A write that fails (a cache another user owns, a full disk: the rename refused here)
    raises nothing, leaves no scratch file, and the measurement still decides for this
    process."""
    monkeypatch.setattr(calibrate, "measure", lambda *calls: [1.0, 2.0])

    def refused(*args):
        raise PermissionError("refused")
    monkeypatch.setattr(calibrate.os, "replace", refused)
    assert calibrate.own_is_faster("unwritable", lambda: (None, None)) is True
    calibrate.flush()
    folder = os.path.dirname(calibrate.path())
    assert not os.path.exists(calibrate.path())
    assert not [f for f in os.listdir(folder) if f.startswith("calibration-")]
    assert "unwritable" in calibrate.measured()


def test_free_cores_lie_between_one_and_the_team():
    assert 1 <= calibrate.free_cores() <= team.team_size()


def test_free_cores_count_this_processes_threads_around_the_systems_count(monkeypatch):
    """Other work is the system's runnable threads less this process's, counted before and
    after (a team member that falls asleep between the reads is not other work); alone on
    the machine, this process's threads are not read at all."""
    monkeypatch.delenv(calibrate.ENVIRONMENT, raising=False)
    monkeypatch.setattr(calibrate, "team_size", lambda: 4)
    monkeypatch.setattr(calibrate, "FREE_SECONDS", 0.0)  # (every call reads,
    monkeypatch.setattr(calibrate, "_all_free_until", [0.0])  # an earlier test's reading too)

    def reads(running, own):
        running, own = iter(running), iter(own)
        monkeypatch.setattr(calibrate, "_running", lambda: next(running))
        monkeypatch.setattr(calibrate, "_own_running", lambda: next(own))

    reads([1], [])  # (an own read would raise StopIteration)
    assert calibrate.free_cores() == 4
    reads([3, 3], [2, 2])  # this thread, one member, one other process
    assert calibrate.free_cores() == 3
    reads([3, 3], [3, 2])  # a member fell asleep after the system's count: not other work
    assert calibrate.free_cores() == 4
    reads([6, 6], [1, 1])  # five others: never below one
    assert calibrate.free_cores() == 1
    reads([None], [])  # unreadable: the whole team
    assert calibrate.free_cores() == 4


def _counted_reads(monkeypatch, name, found):
    """``calibrate.<name>`` answering ``found[0]`` (a team of two, nothing forced), each
    answer counted, under a clock the test moves: ``(clock, reads)``."""
    monkeypatch.delenv(calibrate.ENVIRONMENT, raising=False)
    monkeypatch.setattr(calibrate, "team_size", lambda: 2)
    clock, reads = [100.0], []
    monkeypatch.setattr(calibrate, "_now", lambda: clock[0])
    monkeypatch.setattr(calibrate, name, lambda: reads.append(1) or found[0])
    return clock, reads


def test_a_reading_with_every_core_free_stands_for_a_moment(monkeypatch):
    """After a reading that found every core free, the next calls within ``FREE_SECONDS`` read
    nothing; a reading that found other work stands for no call; after the moment, read again."""
    monkeypatch.setattr(calibrate, "_all_free_until", [0.0])
    found = [1]
    clock, read = _counted_reads(monkeypatch, "_read_free_cores", found)
    assert calibrate.free_cores() == 1 and calibrate.free_cores() == 1 and len(read) == 2
    found[0] = 2
    assert calibrate.free_cores() == 2 and len(read) == 3
    found[0] = 1  # (other work began: not seen within the moment)
    clock[0] += calibrate.FREE_SECONDS / 2
    assert calibrate.free_cores() == 2 and len(read) == 3
    clock[0] += calibrate.FREE_SECONDS
    assert calibrate.free_cores() == 1 and len(read) == 4


def test_a_calls_team_is_not_shrunk_by_work_that_shows_for_a_moment(monkeypatch):
    """Other work seen once is looked at again: the most free cores of up to three reads size
    the call's team; work that shows in every read shrinks it."""
    monkeypatch.setattr(calibrate, "team_size", lambda: 2)
    monkeypatch.delenv(calibrate.ENVIRONMENT, raising=False)
    for reads, team in (([1, 2], 2), ([1, 1, 2], 2), ([1, 1, 1], 1), ([2], 2)):
        monkeypatch.setattr(calibrate, "_busy_until", [0.0, 1])  # (each case read afresh)
        reads = iter(reads)
        monkeypatch.setattr(calibrate, "free_cores", lambda: next(reads))
        assert calibrate.free_cores_for_a_call(pause=0) == team
        assert next(reads, None) is None  # (no read more than needed)


def test_work_seen_in_every_read_stands_for_a_moment(monkeypatch):
    """A call that found other work in all its reads sizes the calls of the next
    ``FREE_SECONDS`` without reading or pausing; after the moment, read again; a forced
    choice reads nothing kept."""
    monkeypatch.setattr(calibrate, "_busy_until", [0.0, 1])
    found = [1]
    clock, read = _counted_reads(monkeypatch, "free_cores", found)
    monkeypatch.setattr(calibrate.time, "sleep", lambda s: pytest.fail("paused within the moment")
                        if len(read) > 3 else None)
    assert calibrate.free_cores_for_a_call() == 1 and len(read) == 3
    found[0] = 2  # (the work ended: not seen within the moment)
    clock[0] += calibrate.FREE_SECONDS / 2
    assert calibrate.free_cores_for_a_call() == 1 and len(read) == 3
    clock[0] += calibrate.FREE_SECONDS
    assert calibrate.free_cores_for_a_call() == 2 and len(read) == 4
    found[0] = 1
    monkeypatch.setattr(calibrate.time, "sleep", lambda s: None)
    assert calibrate.free_cores_for_a_call() == 1 and len(read) == 7
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")  # (forced: the kept reading is not used)
    found[0] = 2
    assert calibrate.free_cores_for_a_call() == 2 and len(read) == 8


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="no /proc/loadavg here")
def test_the_running_threads_are_read_from_descriptors_kept_per_process():
    """/proc/loadavg and this process's task files are read again from their start on the
    descriptors opened at first use (a kernel file is made anew at each read); a forked child
    opens its own."""
    first = calibrate._running()
    assert isinstance(first, int) and first >= 1
    assert 1 <= calibrate._own_running() <= len(os.listdir("/proc/self/task"))
    pid, fd = calibrate._opened["/proc/loadavg"]
    assert pid == os.getpid()
    assert calibrate._running() >= 1 and calibrate._opened["/proc/loadavg"] == (pid, fd)
    child = os.fork()
    if child == 0:  # (the child's answer is its exit status)
        os._exit(0 if calibrate._running() >= 1 and calibrate._own_running() >= 1
                 and calibrate._opened["/proc/loadavg"][0] == os.getpid()
                 and calibrate._opened["/proc/loadavg"][1] != fd else 1)
    assert os.waitpid(child, 0)[1] == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc/self/task here")
def test_a_task_file_of_an_ended_thread_is_closed():
    import threading

    ended = threading.Thread(target=calibrate._own_running)
    ended.start()
    ended.join()
    own = f"/proc/self/task/{ended.native_id}/stat"
    # (join returns when the Python thread is done; the system's thread may still be leaving,
    # its task file there a moment longer on a busy machine)
    deadline = time.monotonic() + 10
    while os.path.exists(own) and time.monotonic() < deadline:
        time.sleep(0.001)
    stale = [p for p in calibrate._opened if p.startswith("/proc/self/task/")
             and not os.path.exists(p)]
    assert own in stale  # (the ended thread's own file, read while it ran)
    calibrate._forget_ended(os.listdir("/proc/self/task"))
    assert not any(p in calibrate._opened for p in stale)
    assert calibrate._own_running() >= 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc/self/task here")
def test_free_cores_from_many_threads_at_once():
    """Threads that start, count and end while others count: every answer within the team,
    no error from the shared descriptors."""
    import threading

    answers, errors = [], []

    def count():
        try:
            for _ in range(50):
                answers.append(calibrate.free_cores())
                calibrate._forget_ended(os.listdir("/proc/self/task"))
        except Exception as exc:  # (reported below, with the thread's error)
            errors.append(exc)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(answers) == 400 and all(1 <= a <= team.team_size() for a in answers)


def test_another_cpu_or_blas_measures_again(fresh_calibration, monkeypatch):
    from minicavs.cpu import blas

    first = calibrate.path()
    calibrate.path.cache_clear()
    monkeypatch.setattr(blas, "identity", lambda: "another BLAS 1.0")
    assert calibrate.path() != first
    calibrate.path.cache_clear()
    monkeypatch.setattr(build, "cpu_signature", lambda: "x86_64 another CPU")
    assert calibrate.path() != first
    assert os.path.dirname(first) == build.cache_dir()


@needs_native
def test_products_follow_the_measured_choice(fresh_calibration, monkeypatch):
    """With a measurement saying the panels (or the team) are slower, the product is left to
    NumPy; saying faster, it runs on them."""
    rng = np.random.default_rng(9)
    W = rng.standard_normal((128, 256)).astype(np.float32)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    for own_wins in (False, True):
        monkeypatch.setattr(calibrate, "measure",
                            lambda *calls: [1.0, 2.0] if own_wins else [2.0, 1.0])
        monkeypatch.setattr(calibrate, "_table", None)
        monkeypatch.setattr(products, "_wins", {})
        with open(calibrate.path(), "w") as f:
            f.write("{}")
        with products.team_products(), products.invariant_operands([W]):
            got = products.matmul(x, W)
        assert (got is not None) == own_wins
        if own_wins:
            np.testing.assert_allclose(got, x @ W, rtol=3e-5, atol=1e-4)
        names = list(calibrate.measured())
        assert any(n.startswith("panels f32 6x128x256") for n in names), names  # (6 rows)


@needs_native
@pytest.mark.parametrize("target", list(isa.TARGETS))
@pytest.mark.parametrize("choice", ["own", "blas"])
def test_each_variants_convolution_loops_equal_numpy(monkeypatch, target, choice):
    """The convolution's products (``cpu/conv.py``) on each variant's own loops (filter rows,
    dot-product tiles: every row tail and filter count left over by the tiles) and on the
    gemm, against NumPy's einsum in float64."""
    from minicavs.cpu import conv

    _skip_unless_runs(target)
    monkeypatch.setenv(isa.ENVIRONMENT, target)
    monkeypatch.setenv(calibrate.ENVIRONMENT, choice)
    rng = np.random.default_rng(10)
    for dtype, tol in ((np.float32, 3e-5), (np.float64, 1e-12)):
        for samples, channels, outs, k, size in ((2, 3, 7, 3, 13), (3, 2, 9, 2, 20)):
            positions = size - k + 1  # (121 and 361: no vector width divides them)
            cols = rng.standard_normal((samples, channels, k, k, positions, positions))
            w = rng.standard_normal((outs, channels, k, k))
            b = rng.standard_normal(outs)
            g = rng.standard_normal((samples, outs, positions, positions))
            cast = [a.astype(dtype) for a in (cols, w, b, g)]
            y = conv.product(cast[0], cast[1], cast[2], 2)
            np.testing.assert_allclose(
                y, np.einsum("pcijxy,ocij->poxy", cols, w) + b[:, None, None], rtol=tol,
                atol=tol * 10)
            np.testing.assert_allclose(conv.weight_grad(cast[0], cast[3], 2),
                                       np.einsum("pcijxy,poxy->ocij", cols, g), rtol=tol,
                                       atol=tol * 100)
            np.testing.assert_allclose(conv.input_grad(cast[3], cast[1], 2),
                                       np.einsum("poxy,ocij->pcijxy", g, w), rtol=tol,
                                       atol=tol * 10)


@needs_native
def test_a_team_block_takes_only_the_free_cores(monkeypatch):
    """Inside a call of native loops the team (level loops, panels, team products) is sized
    to the cores no other work held when the call began; outside, every core."""
    cores = team.team_size()
    monkeypatch.setattr(calibrate, "free_cores", lambda: 1)
    with products.team_products():
        assert team.team_size() == 1
        with products.team_products():  # nested: the outer call's team
            assert team.team_size() == 1
        x = np.ones((300, 200))
        assert products.team_matmul(x, x.T, measured=False) is None  # no team of one
    assert team.team_size() == cores


@needs_native
@pytest.mark.skipif(not isa.x86() or shutil.which("objdump") is None,
                    reason="the vector registers are read from x86 machine code with objdump")
def test_each_variants_panel_kernel_uses_its_own_vector_registers():
    """The compiled panel loop of each variant runs on its target's registers — zmm for
    AVX-512, ymm and no zmm for AVX2, neither for the portable build — whatever this CPU is."""
    kernels.library()
    path = build.library_path(kernels._SOURCE, "kernels")
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                             text=True, check=True).stdout
    bodies = {}
    for block in listing.split("\n\n"):
        name = block.split("\n", 1)[0]  # "<address> <symbol>:", the panels' loop (or the
        for target in isa.TARGETS:  # entry point it was inlined into)
            if f"<_ZN{len(target)}{target}L13packed_panelsIfE" in name or \
                    f"<{target}_packed_panels_f32>" in name:
                bodies[target] = bodies.get(target, "") + block
    assert set(bodies) == set(isa.TARGETS)
    assert "%zmm" in bodies["avx512"]
    assert "%ymm" in bodies["avx2"] and "%zmm" not in bodies["avx2"]
    assert "%ymm" not in bodies["portable"] and "%zmm" not in bodies["portable"]


@needs_native
def test_a_team_splits_from_the_first_size_it_wins_twice_in_a_row(fresh_calibration,
                                                                  monkeypatch):
    """The probe's sizes are measured upward until the team wins at two in a row (the first of
    them is the split), then the costs of an element and a multiply-add; a loss is measured
    once more; never winning, no split; kept like any choice."""
    calls = []

    def measure(team, one):  # the team wins from 2^14, and at 2^12 by a fluke
        calls.append(1)
        return [1.0, 2.0] if len(calls) in (5, 8, 9) else [2.0, 1.0]
    monkeypatch.setattr(calibrate, "measure", measure)
    split, rate = calibrate._measure_split(3)
    assert split == 1 << 14 and rate == (1 << 14, 1.0 / (1 << 16), 2.0 / (64 * 256 * 256))
    assert len(calls) == 10  # 2^10 .. 2^15 (each loss twice: 2^10, 2^11, 2^13), the costs
    monkeypatch.setattr(calibrate, "measure", lambda team, one: [2.0, 1.0])
    assert calibrate._measure_split(5) == (None, None)
    names = [k for k in calibrate.measured() if k.startswith("team split <=")]
    assert len(names) == 6 + len(calibrate.SPLIT_PROBE)


def test_a_team_still_settling_after_its_call_is_not_other_work(monkeypatch):
    """Right after a team's call its members may still run for a moment: the cores are asked
    again a millisecond later (measured here: 2 of 12 fresh processes measured the split when
    one look decided, 12 of 12 with the second look)."""
    free = [1, 1, 2]
    monkeypatch.setattr(calibrate, "free_cores", lambda: free.pop(0) if len(free) > 1 else free[0])
    assert calibrate._quiet(2)
    free[:] = [1]
    assert not calibrate._quiet(2)  # (other work: still one core after five looks)


@needs_native
def test_one_slow_moment_after_a_win_does_not_move_the_split(fresh_calibration, monkeypatch):
    """The team wins at 2^11, loses at 2^12 by 40x (another process held the second core for
    that size's rounds), wins when 2^12 is measured again: the split is 2^11, not the next two
    sizes the team wins, and the best of both measurements is what is kept."""
    results = iter([[2.0, 1.0], [2.0, 1.0], [1.0, 2.0], [40.0, 1.0], [0.5, 1.0], [2.0, 1.0]])
    monkeypatch.setattr(calibrate, "measure", lambda team, one: next(results))
    split, _ = calibrate._measure_split(3)
    assert split == 1 << 11
    assert calibrate.measured()["team split <=4096 elements (3 threads)"] == [0.5, 1.0]


@needs_native
def test_a_slow_minute_at_every_size_does_not_set_the_split_for_good(fresh_calibration,
                                                                    monkeypatch):
    """A slow minute of a shared core makes the team's first look 4x slower at each size: the
    second look decides (the best of each side kept), and a size the team lost at both looks
    is looked at a third time by a later process, which may move the split down."""
    slow, fast = [4.0, 1.0], [0.5, 1.0]
    results = iter([slow, slow,  # 2^10: lost twice
                    slow, fast,  # 2^11: won at the second look
                    fast,  # 2^12: a clear win at once
                    [2.0, 1.0]])  # (the costs of an element and a multiply-add)
    monkeypatch.setattr(calibrate, "measure", lambda team, one: next(results))
    assert calibrate._measure_split(3)[0] == 1 << 11
    assert calibrate._load()["team split <=2048 elements (3 threads)"] == [0.5, 1.0, 2]
    monkeypatch.setattr(calibrate, "_looked_here", set())  # (a later process)
    results = iter([fast])  # 2^10's third look (the costs are kept)
    assert calibrate._measure_split(3)[0] == 1 << 10
    assert calibrate._load()["team split <=1024 elements (3 threads)"] == [0.5, 1.0, 3]


@needs_native
def test_a_team_measured_while_its_cores_are_busy_is_tried_again_later(fresh_calibration,
                                                                        monkeypatch):
    """Other work on the cores: no split now, nothing kept (not even for this process), and
    the next try only after ``RETRY_SECONDS``; then a quiet measurement holds for the process."""
    monkeypatch.setattr(calibrate, "_splits", {})
    monkeypatch.setattr(calibrate, "_retry", {})
    monkeypatch.setattr(calibrate, "measure", lambda team, one: [1.0, 2.0])
    free = [1]
    monkeypatch.setattr(calibrate, "free_cores", lambda: free[0])
    assert calibrate.split_elements(2) is None  # busy before: not measured
    assert calibrate.measured() == {}
    free[:] = [2, 1]  # quiet when it starts, busy when it ends
    monkeypatch.setattr(calibrate, "free_cores", lambda: free.pop(0) if len(free) > 1 else free[0])
    assert calibrate.split_elements(2) is None
    assert calibrate.measured() == {}  # a disturbed measurement is not kept
    free[:] = [2]
    assert calibrate.split_elements(2) is None  # (before RETRY_SECONDS)
    monkeypatch.setattr(calibrate, "RETRY_SECONDS", 0.0)
    calibrate._retry.clear()
    assert calibrate.split_elements(2) == 1 << 10  # the team wins everywhere here
    free[:] = [1]
    assert calibrate.split_elements(2) == 1 << 10  # (measured once a process)


@needs_native
def test_team_loops_take_their_threads_from_the_measured_split(monkeypatch):
    """Forced: ``own`` splits from the probe's first size (tests run the team's code), ``blas``
    never; the kernels that split rows (cross-entropy, Adam) equal NumPy on a team."""
    monkeypatch.setenv(calibrate.ENVIRONMENT, "blas")
    assert calibrate.threads_for(1 << 30) == 1
    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    threads = team.team_size()
    assert calibrate.threads_for(1 << 10) == threads and calibrate.threads_for(1 << 9) == 1
    rng = np.random.default_rng(5)
    logits, labels = rng.standard_normal((64, 100)), rng.integers(0, 100, 64)
    shifted = logits - logits.max(1, keepdims=True)
    expected = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(64), labels]
    np.testing.assert_allclose(kernels.softmax_cross_entropy(logits, labels), expected,
                               rtol=1e-12)
    p, g = rng.standard_normal(5000), rng.standard_normal(5000)
    m, v, want = np.zeros(5000), np.zeros(5000), p.copy()
    assert kernels.adam([p], [g], [m], [v], 0.9, 0.999, 1e-8, 1e-3, 0.01, 1.0)
    mm, vv = 0.1 * g, 0.001 * g * g
    np.testing.assert_allclose(p, want - 0.01 * mm / (np.sqrt(vv / 1e-3) + 1e-8), rtol=1e-12)


@needs_native
def test_the_doctor_prints_the_target_and_every_choice_with_its_times(fresh_calibration):
    import io

    from minicavs.doctor import run_doctor

    text = io.StringIO()
    assert run_doctor(text) == 0
    lines = text.getvalue().splitlines()
    assert any("cpu kernels" in x and isa.describe() in x for x in lines)
    assert any("kernel choices" in x and x.strip().endswith(".json") for x in lines)
    # measured now on a fresh machine's file, four rows named by their count (products.rows_key)
    tagger = [x for x in lines if f"panels f32 4x256x1024 ({isa.target()}" in x]
    assert tagger and all(" us: " in x and ("own" in x or "BLAS" in x) for x in tagger)
    assert any("cpu team" in x and "thread(s)" in x for x in lines)
    (flags,) = [x for x in lines if "native flags" in x]  # the build the choices belong to
    assert "-O3" in flags
    assert ("-mtune=generic" in flags) == (isa.x86() and isa.target() != "avx512")
    assert ("-mprefer-vector-width=512" in flags) == (isa.target() == "avx512")


def test_forgotten_choices_are_measured_again_and_the_doctor_forgets_them(fresh_calibration,
                                                                          monkeypatch):
    """``calibrate.forget`` (``doctor --measure-again``) removes this build's file of choices:
    a choice kept there is measured anew at its next use, by this process and the next."""
    import io

    from minicavs.__main__ import build_parser
    from minicavs.doctor import run_doctor

    slow = lambda: sum(range(20000))  # noqa: E731
    made = []

    def make(first, second):
        made.append(1)
        return first, second

    assert calibrate.own_is_faster("demo", lambda: make(lambda: None, slow)) is True
    calibrate.flush()
    assert os.path.exists(calibrate.path())
    assert calibrate.forget() == calibrate.path() and not os.path.exists(calibrate.path())
    assert calibrate.forget() is None  # (nothing kept: nothing to remove)
    # measured again, now the other way round: the new verdict stands, the old is gone
    assert calibrate.own_is_faster("demo", lambda: make(slow, lambda: None)) is False
    assert len(made) >= 2 and calibrate.measured()["demo"][0] > calibrate.measured()["demo"][1]
    calibrate.flush()

    text = io.StringIO()
    assert run_doctor(text, measure_again=True) == 0
    assert any("kernel choices" in x and "forgotten" in x and calibrate.path() in x
               for x in text.getvalue().splitlines())
    assert "demo" not in calibrate.measured()  # (the doctor measured its own products anew)
    assert build_parser().parse_args(["doctor", "--measure-again"]).measure_again


def test_an_avx2_build_is_asked_for_by_minicavs_march(monkeypatch, tmp_path):
    """``MINICAVS_MARCH=x86-64-v3`` (with ``MINICAVS_CPU_TARGET=avx2``): the AVX2 build an
    AVX-512 machine runs too, cached apart from the native one, and it runs here."""
    monkeypatch.setenv("MINICAVS_MARCH", "x86-64-v3")
    build.cxx_flags.cache_clear()
    try:
        assert "-march=x86-64-v3" in build.cxx_flags()
        assert "-march=native" not in build.cxx_flags()
        if isa.x86() and isa.target() != "avx512":  # scheduled as the AVX2 build is
            assert "-mtune=generic" in build.cxx_flags()
    finally:
        build.cxx_flags.cache_clear()
    if build.unavailable() is not None or not isa.runs_here("avx2"):
        pytest.skip("needs native code and an AVX2 CPU to run the AVX2 build")
    env = dict(os.environ, MINICAVS_MARCH="x86-64-v3", MINICAVS_CPU_TARGET="avx2",
               MINICAVS_CACHE_DIR=str(tmp_path))
    # the doctor compiles a test cell's level loop and compares it with the interpreter
    done = subprocess.run([sys.executable, "-m", "minicavs", "doctor"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "native C++ level loops (ok" in done.stdout


def test_loops_outside_a_native_call_take_only_the_cores_free_now(monkeypatch):
    """A loop large enough to split takes the team inside a call of native loops (its cores
    were free when the call began), and outside one only the cores free now."""
    monkeypatch.setattr(calibrate, "split_elements", lambda threads: 1024)
    monkeypatch.setattr(calibrate, "team_size", lambda: 4)
    monkeypatch.setattr(calibrate, "in_team_products", lambda: False)
    monkeypatch.setattr(calibrate, "free_cores", lambda: 1)
    assert calibrate.threads_for(1 << 20) == 1
    monkeypatch.setattr(calibrate, "free_cores", lambda: 3)
    assert calibrate.threads_for(1 << 20) == 3
    assert calibrate.threads_for(1000) == 1
    monkeypatch.setattr(calibrate, "in_team_products", lambda: True)
    assert calibrate.threads_for(1 << 20) == 4
