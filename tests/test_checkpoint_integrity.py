"""Checkpoints and resume say what they hold (issue 23, class 6): ``mc.save`` files carry a
checksum, the key that marks arrays is reserved, object arrays are refused at save, ``--resume``
trains with the learning rate it records, and a resumed run on other data is refused."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import minicavs as mc
from minicavs.__main__ import main
from minicavs.errors import CheckpointError

_FAST = settings(max_examples=30, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

arrays = st.builds(lambda shape, seed, kind: np.random.default_rng(seed).standard_normal(
                       shape).astype(kind),
                   st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 99),
                   st.sampled_from(["float32", "float64", "int64"]))
keys = st.text("abcxyz_", min_size=1, max_size=6)
trees = st.recursive(arrays | st.integers(-5, 5) | st.none() | st.text("ab", max_size=3),
                     lambda inner: st.dictionaries(keys, inner, max_size=3)
                     | st.lists(inner, max_size=3), max_leaves=8)


def _with_an_array(tree):
    return {"weights": np.arange(6.0).reshape(2, 3), "rest": tree}


@_FAST
@given(tree=trees, seed=st.integers(0, 2**32 - 1))
def test_an_array_edited_after_mc_save_is_refused(tmp_path, tree, seed):
    path = tmp_path / "state.npz"
    mc.save(_with_an_array(tree), path)
    with np.load(path) as archive:
        stored = {name: archive[name] for name in archive.files}
    rng = np.random.default_rng(seed)
    name = sorted(k for k in stored if k != "__metadata__")[rng.integers(0, len(stored) - 1)]
    edited = stored[name].copy()
    flat = edited.reshape(-1)
    flat[rng.integers(0, flat.size)] += 1  # one value changed, the zip's own CRCs rewritten
    stored[name] = edited
    np.savez(path, **stored)
    with pytest.raises(CheckpointError, match="corrupt.*checksum"):
        mc.load(path)


@_FAST
@given(tree=trees)
def test_what_mc_save_writes_mc_load_reads(tmp_path, tree):
    path = tmp_path / "state.npz"
    mc.save(_with_an_array(tree), path)

    def same(a, b):
        if isinstance(a, np.ndarray):
            return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    assert same(_with_an_array(tree), mc.load(path))


@_FAST
@given(tree=trees, depth=st.integers(0, 3), value=trees)
def test_the_reserved_key_in_user_data_is_refused_at_save(tmp_path, tree, depth, value):
    data = {"__tree__": value, "other": tree}
    for level in range(depth):
        data = {f"level{level}": data}
    with pytest.raises(CheckpointError, match="'__tree__'.*reserved"):
        mc.save(data, tmp_path / "state.npz")
    assert not (tmp_path / "state.npz").exists()


@pytest.mark.parametrize("make", [
    lambda: np.array([{"a": 1}, None], dtype=object),
    lambda: np.array([1, "two", 3.0], dtype=object),
    lambda: np.zeros(2, dtype=[("x", "f4"), ("obj", "O")]),
], ids=["dicts", "mixed", "structured with an object field"])
def test_object_arrays_are_refused_at_save_not_called_corrupt_at_load(tmp_path, make):
    with pytest.raises(CheckpointError, match="object") as info:
        mc.save({"model": {"w": np.ones(3)}, "odd": make()}, tmp_path / "state.npz")
    assert "/odd" in str(info.value)
    assert not (tmp_path / "state.npz").exists()


# --- --resume ----------------------------------------------------------------------------------

_TINY = ["--hidden", "4", "--embed-dim", "4", "--no-progress", "--batch-size", "8"]


def _metadata(path):
    with np.load(path) as archive:
        return json.loads(archive["__metadata__"].tobytes().decode())


def _train(tmp_path, *flags):
    return main(["train", "tree-lstm", *_TINY, *flags])


@pytest.mark.parametrize("new_lr", [None, 0.002])
def test_resume_trains_with_the_learning_rate_it_records(tmp_path, monkeypatch, capsys, new_lr):
    monkeypatch.chdir(tmp_path)
    assert _train(tmp_path, "--sizes", "24,8,8", "--epochs", "1", "--lr", "0.01",
                  "--save", "first.npz") == 0
    flags = [] if new_lr is None else ["--lr", str(new_lr)]
    assert _train(tmp_path, "--sizes", "24,8,8", "--epochs", "2", "--resume", "first.npz",
                  "--save", "second.npz", *flags) == 0
    saved = _metadata(tmp_path / "second.npz")
    trained_with = saved["optimizer"]["hyperparameters"]["lr"]
    assert trained_with == saved["hyperparameters"]["lr"]  # what it says is what it did
    assert trained_with == (0.01 if new_lr is None else new_lr)
    if new_lr is not None:
        assert "learning rate 0.002 (--lr), where the checkpoint trained with 0.01" in (
            capsys.readouterr().out)


def _sst(folder, words):
    """A tiny SST directory whose training trees use ``words``."""
    folder.mkdir()
    lines = [f"(3 (2 {a}) (4 {b}))" for a, b in zip(words, words[1:] + words[:1])]
    for name in ("train", "dev", "test"):
        (folder / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return str(folder)


@pytest.mark.parametrize("change", ["other words, same vocabulary size",
                                    "same words, other trees", "other synthetic seed"])
def test_resume_on_other_data_is_refused(tmp_path, monkeypatch, capsys, change):
    monkeypatch.chdir(tmp_path)
    if change == "other synthetic seed":
        first, second = ["--sizes", "24,8,8"], ["--sizes", "24,8,8", "--seed", "1"]
    else:
        words = ["good", "bad", "fine", "dull", "grand", "poor"]
        first = ["--data", _sst(tmp_path / "a", words)]
        other = (["nice", "sad", "okay", "flat", "great", "weak"]
                 if change.startswith("other words") else words[::-1])
        second = ["--data", _sst(tmp_path / "b", other)]
    assert _train(tmp_path, *first, "--epochs", "1", "--save", "first.npz") == 0
    capsys.readouterr()
    status = _train(tmp_path, *second, "--epochs", "2", "--resume", "first.npz",
                    "--save", "second.npz")
    out = capsys.readouterr().out
    assert status == 1, out
    expected = "another vocabulary" if change.startswith("other words") else "other training"
    assert "--resume" in out and expected in out
    assert not (tmp_path / "second.npz").exists()
