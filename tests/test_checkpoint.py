"""Checkpoints: bitwise round trips through a fresh process, identical resumed training,
atomic writes, and clear errors for corrupt, foreign or mismatched files."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import minicavs as mc
from minicavs import nn
from minicavs.nn import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run both here and in a fresh interpreter, so the two build the same model and data.
TRAINING = '''
import numpy as np
import minicavs as mc


class Tiny(mc.nn.Module):
    def __init__(self, hidden=5):
        self.embed = mc.nn.Embedding(6, 4)
        self.hidden = mc.nn.Linear(4, hidden)
        self.out = mc.nn.Linear(hidden, 3)

    def forward(self, ids):
        return self.out(mc.tanh(self.hidden(self.embed(ids))))


OPTIMISERS = {
    "adam": lambda ps: mc.nn.Adam(ps, lr=0.05),
    "sgd": lambda ps: mc.nn.SGD(ps, lr=0.2, momentum=0.9),
    "adagrad": lambda ps: mc.nn.Adagrad(ps, lr=0.2),
}


def build(seed, optimiser="adam"):
    mc.seed(seed)
    model = Tiny()
    return model, OPTIMISERS[optimiser](model.parameters())


def train(model, optimizer, start, stop):
    data = np.random.default_rng(123)
    ids, labels = data.integers(0, 6, size=(5, 8)), data.integers(0, 3, size=(5, 8))
    for step in range(start, stop):  # the batch depends on the step: resuming must know it
        optimizer.zero_grad()
        mc.softmax_cross_entropy(model(ids[step % 5]), labels[step % 5]).backward()
        optimizer.step()
'''
_namespace = {}
exec(TRAINING, _namespace)
Tiny, build, train = _namespace["Tiny"], _namespace["build"], _namespace["train"]


def fresh_python(code):
    """Run ``code`` after TRAINING in a new interpreter; fail with its stderr if it fails."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", TRAINING + code], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_bitwise_equal(state, other):
    assert list(state) == list(other)
    for name in state:
        assert state[name].dtype == other[name].dtype, name
        assert state[name].tobytes() == other[name].tobytes(), name


def test_round_trip_in_a_fresh_process_is_bitwise_exact(tmp_path):
    model, opt = build(seed=0)
    train(model, opt, 0, 3)
    path = tmp_path / "model.npz"
    hyper = {"lr": 0.05, "hidden": 5, "betas": (0.9, 0.999), "scale": np.float32(0.5)}
    nn.save_checkpoint(path, model, opt, hyperparameters=hyper, extra={"step": 3})
    out = fresh_python(f'''
model, opt = build(seed=99)  # other initial weights: all must come from the file
info = mc.nn.load_checkpoint({str(path)!r}, model, opt)
np.savez({str(tmp_path / "reloaded.npz")!r}, **model.state_dict())
import json; print(json.dumps(info))
''')
    with np.load(tmp_path / "reloaded.npz") as reloaded:
        assert_bitwise_equal(model.state_dict(), dict(reloaded))
    info = json.loads(out)
    assert info["hyperparameters"] == {"lr": 0.05, "hidden": 5, "betas": [0.9, 0.999],
                                       "scale": 0.5}
    assert info["extra"] == {"step": 3}
    assert info["format_version"] == nn.FORMAT_VERSION


@pytest.mark.parametrize("optimiser", ["adam", "sgd", "adagrad"])
def test_training_resumes_identically_in_a_fresh_process(tmp_path, optimiser):
    total, stop_at = 8, 3
    straight, opt = build(seed=0, optimiser=optimiser)
    train(straight, opt, 0, total)

    model, opt = build(seed=0, optimiser=optimiser)
    train(model, opt, 0, stop_at)
    nn.save_checkpoint(tmp_path / "ckpt.npz", model, opt, extra={"step": stop_at})
    fresh_python(f'''
model, opt = build(seed=7, optimiser={optimiser!r})
step = mc.nn.load_checkpoint({str(tmp_path / "ckpt.npz")!r}, model, opt)["extra"]["step"]
train(model, opt, step, {total})
np.savez({str(tmp_path / "resumed.npz")!r}, **model.state_dict())
''')
    with np.load(tmp_path / "resumed.npz") as resumed:
        assert_bitwise_equal(straight.state_dict(), dict(resumed))


# --- errors on load ---------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    model, opt = build(seed=0)
    train(model, opt, 0, 2)
    path = tmp_path / "ckpt.npz"
    nn.save_checkpoint(path, model, opt)
    return path, model, opt


@pytest.mark.parametrize("damage", ["half", "tail", "garbage", "empty", "flipped byte"])
def test_truncated_or_corrupt_files_give_a_checkpoint_error(saved, damage):
    path, _, _ = saved
    data = path.read_bytes()
    damaged = {"half": data[:len(data) // 2], "tail": data[:-10], "garbage": b"not a zip" * 50,
               "empty": b"",
               "flipped byte": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF])
               + data[len(data) // 2 + 1:]}[damage]
    path.write_bytes(damaged)
    model, opt = build(seed=1)
    before = model.state_dict()
    with pytest.raises(mc.CheckpointError, match=r"checkpoint .*ckpt\.npz.* (is truncated or "
                                                 r"corrupt|metadata is corrupt)"):
        nn.load_checkpoint(path, model, opt)
    assert_bitwise_equal(before, model.state_dict())


def test_missing_file_and_foreign_npz(tmp_path):
    model, _ = build(seed=0)
    with pytest.raises(mc.CheckpointError, match="no checkpoint at .*nothing.npz"):
        nn.load_checkpoint(tmp_path / "nothing.npz", model)
    np.savez(tmp_path / "weights.npz", w=np.zeros(3))
    with pytest.raises(mc.CheckpointError, match="is a .npz file but not a minicavs checkpoint"):
        nn.load_checkpoint(tmp_path / "weights.npz", model)


def _rewrite_metadata(path, change):
    with np.load(path) as archive:
        arrays = dict(archive)
    metadata = json.loads(arrays["__metadata__"].tobytes())
    change(metadata)
    arrays["__metadata__"] = np.frombuffer(json.dumps(metadata).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_other_format_version_is_refused(saved):
    path, model, _ = saved
    _rewrite_metadata(path, lambda m: m.update(format_version=99))
    with pytest.raises(mc.CheckpointError, match=r"has format version 99; this minicavs .* reads "
                                                 r"version 1"):
        nn.load_checkpoint(path, model)


def test_metadata_and_arrays_must_agree(saved):
    path, model, _ = saved
    _rewrite_metadata(path, lambda m: m["parameters"][0].update(shape=[6, 5]))
    with pytest.raises(mc.CheckpointError, match=r"corrupt: parameter 'embed.weight' is listed "
                                                 r"as \(6, 5\) float32 but stored as \(6, 4\)"):
        nn.load_checkpoint(path, model)


def test_mismatched_architecture_is_described_and_changes_nothing(saved):
    path, _, _ = saved
    mc.seed(3)
    wider = Tiny(hidden=7)
    before = wider.state_dict()
    with pytest.raises(mc.CheckpointError) as info:
        nn.load_checkpoint(path, wider)
    message = str(info.value)
    assert "does not match the model (Tiny)" in message
    assert "'hidden.weight': shape (4, 7) in the model, (4, 5) in the state" in message
    assert "'out.weight': shape (7, 3) in the model, (5, 3) in the state" in message
    assert_bitwise_equal(before, wider.state_dict())

    class Renamed(mc.nn.Module):
        def __init__(self):
            self.embedding = mc.nn.Embedding(6, 4)
    with pytest.raises(mc.CheckpointError, match=r"missing: 'embedding.weight'(.|\n)*unexpected: "
                                                 r"'embed.weight'"):
        nn.load_checkpoint(path, Renamed())


def test_optimiser_mismatches(saved):
    path, model, _ = saved
    with pytest.raises(mc.CheckpointError, match="the optimiser state does not match SGD:\n  "
                                                 "the state is for optimiser 'Adam'"):
        nn.load_checkpoint(path, model, nn.SGD(model.parameters(), lr=0.1))
    nn.save_checkpoint(path, model)  # no optimiser
    with pytest.raises(mc.CheckpointError, match="has no optimiser state"):
        nn.load_checkpoint(path, model, nn.Adam(model.parameters()))
    nn.load_checkpoint(path, model)  # the model alone is fine


def test_optimiser_state_errors_name_the_parameter(saved):
    path, model, _ = saved
    backwards = nn.Adam(model.parameters()[::-1])  # the same parameters in another order
    with pytest.raises(mc.CheckpointError, match=r"parameter 'out.bias': state 'm' has shape "
                                                 r"\(6, 4\) and dtype float32; the parameter has "
                                                 r"shape \(3,\)"):
        nn.load_checkpoint(path, model, backwards)


# --- refusing to save, and atomicity ---------------------------------------------------------

def test_non_finite_parameters_are_refused_and_the_old_file_kept(saved):
    path, model, _ = saved
    original = path.read_bytes()
    model.hidden.bias.data[2] = np.nan
    with pytest.raises(mc.CheckpointError, match=r"parameter 'hidden.bias' has 1 non-finite "
                                                 r"value\(s\) \(NaN or inf\) of 5; refusing"):
        nn.save_checkpoint(path, model)
    model.hidden.bias.data[2] = np.inf
    with pytest.raises(mc.CheckpointError, match="'hidden.bias'"):
        nn.save_checkpoint(path.with_name("new.npz"), model)
    assert path.read_bytes() == original
    assert sorted(os.listdir(path.parent)) == ["ckpt.npz"]


def test_hyperparameters_must_be_json(tmp_path):
    model, _ = build(seed=0)
    with pytest.raises(mc.CheckpointError, match="must be JSON-serialisable"):
        nn.save_checkpoint(tmp_path / "c.npz", model, hyperparameters={"f": object()})
    assert os.listdir(tmp_path) == []


def _interrupting(exception, partial=b"PK\x03\x04 half an archive"):
    def savez(f, **arrays):
        f.write(partial)  # some bytes reach the temporary file, then the write dies
        raise exception
    return savez


@pytest.mark.parametrize("failure", ["disk full", "interrupt", "rename fails"])
def test_an_interrupted_save_leaves_the_old_file_intact(saved, monkeypatch, failure):
    path, model, opt = saved
    original = path.read_bytes()
    train(model, opt, 2, 4)  # new values, so a partial write would show
    if failure == "disk full":
        monkeypatch.setattr(checkpoint.np, "savez", _interrupting(OSError(28, "No space left")))
        expected = OSError
    elif failure == "interrupt":
        monkeypatch.setattr(checkpoint.np, "savez", _interrupting(KeyboardInterrupt()))
        expected = KeyboardInterrupt
    else:
        def replace(src, dst):
            raise OSError("rename failed")
        monkeypatch.setattr(checkpoint.os, "replace", replace)
        expected = OSError
    with pytest.raises(expected):
        nn.save_checkpoint(path, model, opt)
    monkeypatch.undo()
    assert path.read_bytes() == original
    assert sorted(os.listdir(path.parent)) == ["ckpt.npz"]  # no temporary left behind
    fresh, fresh_opt = build(seed=5)
    nn.load_checkpoint(path, fresh, fresh_opt)


def test_save_fsyncs_the_file_and_the_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd")
                      else None)
        real_fsync(fd)
    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    model, _ = build(seed=0)
    nn.save_checkpoint(tmp_path / "d.npz", model)
    assert len(synced) == 2
    if synced[0] is not None:
        assert synced == [False, True]  # first the file's data, then the directory entry


def test_overwriting_a_checkpoint(saved):
    path, model, opt = saved
    train(model, opt, 2, 3)
    nn.save_checkpoint(path, model, opt, extra={"step": 3})
    fresh, fresh_opt = build(seed=5)
    assert nn.load_checkpoint(path, fresh, fresh_opt)["extra"] == {"step": 3}
    assert_bitwise_equal(model.state_dict(), fresh.state_dict())


# --- killed saves, checksums, non-finite files, bad paths --------------------------------------

KILLED_MID_SAVE = '''
import os, signal, sys
from minicavs.nn import checkpoint

def savez(f, **arrays):  # half an archive reaches the disk, then the process is killed
    f.write(b"PK\\x03\\x04 half an archive")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

checkpoint.np.savez = savez
model, opt = build(seed=1)
mc.nn.save_checkpoint(sys.argv[1], model, opt)
'''


def test_temporaries_of_killed_saves_are_removed_by_the_next_save(saved):
    path, model, opt = saved
    original = path.read_bytes()
    env = dict(os.environ, PYTHONPATH=ROOT)
    for kill in range(3):  # each killed save first removes the temporary of the one before
        done = subprocess.run([sys.executable, "-c", TRAINING + KILLED_MID_SAVE, str(path)],
                              env=env, cwd=ROOT, timeout=120)
        assert done.returncode == -9  # SIGKILL
        left = sorted(os.listdir(path.parent))
        assert len(left) == 2 and left[0].startswith(".ckpt.npz.") and left[0].endswith(".tmp")
        assert path.read_bytes() == original  # the previous checkpoint is intact
    nn.load_checkpoint(path, *build(seed=5))

    other = path.with_name("other.npz")  # a save to another path leaves it alone
    nn.save_checkpoint(other, model)
    assert len(os.listdir(path.parent)) == 3
    nn.save_checkpoint(path, model, opt)
    assert sorted(os.listdir(path.parent)) == ["ckpt.npz", "other.npz"]


def test_a_temporary_of_a_live_process_is_kept(saved):
    path, model, _ = saved
    live = path.parent / f".ckpt.npz.{os.getppid()}.0badcafe.tmp"  # our parent is alive
    live.write_bytes(b"being written")
    nn.save_checkpoint(path, model)
    assert live.exists()


def test_a_checkpoint_edited_or_damaged_after_the_save_fails_its_checksum(saved):
    path, model, opt = saved
    with np.load(path) as archive:
        arrays = dict(archive)
    arrays["param/hidden.weight"] = arrays["param/hidden.weight"].copy()
    arrays["param/hidden.weight"][0, 0] += 1.0  # a valid zip with valid CRCs, other values
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    fresh, fresh_opt = build(seed=1)
    before = fresh.state_dict()
    with pytest.raises(mc.CheckpointError, match=r"ckpt\.npz.* is corrupt: its arrays do not "
                                                 r"match the checksum"):
        nn.load_checkpoint(path, fresh, fresh_opt)
    assert_bitwise_equal(before, fresh.state_dict())


def _rewrite_arrays(path, change):
    """Edit a saved checkpoint as a tool outside minicavs would: new arrays, no checksum."""
    with np.load(path) as archive:
        arrays = dict(archive)
    metadata = json.loads(arrays["__metadata__"].tobytes())
    del metadata["checksum"]  # as in a file written before checksums existed
    arrays["__metadata__"] = np.frombuffer(json.dumps(metadata).encode(), np.uint8)
    change(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def test_loading_refuses_non_finite_values_unless_asked(saved):
    path, _, _ = saved
    _rewrite_arrays(path, lambda a: a.update({"param/out.bias": np.array([0, np.nan, np.inf],
                                                                         np.float32)}))
    fresh, _ = build(seed=1)
    before = fresh.state_dict()
    with pytest.raises(mc.CheckpointError, match=r"parameter 'out.bias' has 2 non-finite "
                                                 r"value\(s\) \(NaN or inf\) of 3; refusing to "
                                                 r"load .*allow_non_finite=True"):
        nn.load_checkpoint(path, fresh)
    assert_bitwise_equal(before, fresh.state_dict())
    loaded = nn.load_checkpoint(path, fresh, allow_non_finite=True)
    assert loaded["format_version"] == 1
    assert np.isnan(fresh.out.bias.numpy()[1]) and np.isinf(fresh.out.bias.numpy()[2])


def test_non_finite_optimiser_state_is_refused_too(saved):
    path, _, _ = saved
    _rewrite_arrays(path, lambda a: a.update({"optimizer/0/v": np.full_like(
        a["optimizer/0/v"], np.nan)}))
    fresh, fresh_opt = build(seed=1)
    with pytest.raises(mc.CheckpointError, match=r"optimizer state 'v' of parameter "
                                                 r"'embed.weight' has 24 non-finite"):
        nn.load_checkpoint(path, fresh, fresh_opt)
    nn.load_checkpoint(path, fresh)  # the model alone is finite


@pytest.mark.parametrize("where, message", [
    ("missing/dir/c.npz", r"cannot write '.*missing/dir/c\.npz': its directory .*missing/dir' "
                          r"does not exist"),
    (".", r"is a directory; give a file name"),
    ("", r"path must be a file path, got ''"),
])
def test_save_paths_are_checked_before_writing(tmp_path, where, message):
    model, _ = build(seed=0)
    target = str(tmp_path / where) if where not in ("", ".") else (where and str(tmp_path))
    with pytest.raises(mc.CheckpointError, match=message):
        nn.save_checkpoint(target, model)


def test_unwritable_place_names_the_path_given(tmp_path):
    model, _ = build(seed=0)
    with pytest.raises(mc.CheckpointError, match=r"cannot write '/proc/minicavs\.npz'") as info:
        nn.save_checkpoint("/proc/minicavs.npz", model)
    assert isinstance(info.value, OSError)  # still an OSError for generic handlers
    with pytest.raises(mc.CheckpointError, match="model must be a minicavs.nn.Module, got dict"):
        nn.save_checkpoint(tmp_path / "m.npz", {"w": np.zeros(3)})
