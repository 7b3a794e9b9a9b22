"""Checkpoints: a model's parameters, an optimiser's state and the run's hyperparameters in one
``.npz`` file.

Layout of the archive (plain arrays only, so loading never unpickles anything):

* ``param/<dotted name>``: one array per parameter;
* ``optimizer/<i>/<state name>``: the optimiser's per-parameter state (``i`` in its order);
* ``__metadata__``: UTF-8 JSON (as uint8) with the format name and version, the minicavs
  version, each parameter's name, shape and dtype, the optimiser's type, hyperparameters and
  state names, the caller's ``hyperparameters`` and ``extra``, and a SHA-256 ``checksum`` of
  every array (names, dtypes, shapes and bytes): a file damaged or edited after the save is
  refused even where the zip's own CRCs were rewritten. (Files without a checksum, written
  before it was added, load unverified.)

A save is atomic: the archive is written to a temporary file in the target's directory, flushed
and fsync'ed, then renamed over the target (``os.replace``), and the directory is fsync'ed so the
rename itself survives a crash. An interrupted save leaves the previous file, never half a file.
The temporary file's name holds the saving process's id, so the next save to the same path
removes the temporaries of saves that were killed (their process is gone) and never one that a
live process is still writing. A load checks everything before it changes anything, and refuses
NaN and infinite values unless ``allow_non_finite=True``.
"""

import errno
import hashlib
import json
import os
import re
import secrets

import numpy as np

from .. import __version__
from ..errors import CheckpointError, CheckpointWriteError
from ..ops.registry import describe
from .module import Module, state_mismatches

FORMAT = "minicavs-checkpoint"
FORMAT_VERSION = 1
_METADATA = "__metadata__"


def save_checkpoint(path, model, optimizer=None, hyperparameters=None, extra=None):
    """Write ``model``'s parameters (and ``optimizer``'s state) to ``path`` atomically.

    ``hyperparameters`` and ``extra`` are anything JSON can encode (NumPy scalars and arrays are
    converted); they come back from :func:`load_checkpoint`. Non-finite values are refused with
    a :class:`CheckpointError` naming the parameter: a diverged run must not overwrite a good
    checkpoint.
    """
    _check_objects("save_checkpoint", model, optimizer)
    path = _target(path)
    params = model.state_dict()
    arrays = {f"param/{name}": value for name, value in params.items()}
    metadata = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "minicavs_version": __version__,
        "parameters": [{"name": name, "shape": list(value.shape), "dtype": str(value.dtype)}
                       for name, value in params.items()],
        "optimizer": None, "hyperparameters": hyperparameters, "extra": extra,
    }
    if optimizer is not None:
        state = optimizer.state_dict()
        names = _optimizer_names(model, optimizer)
        metadata["optimizer"] = {"type": state["type"], "hyperparameters": state["hyperparameters"],
                                 "param_groups": state["param_groups"],
                                 "state": [sorted(s) for s in state["state"]]}
        for i, s in enumerate(state["state"]):
            for key, value in s.items():
                arrays[f"optimizer/{i}/{key}"] = value
                _check_finite(value, f"optimizer state {key!r} of {names[i]}")
    for name, value in params.items():
        _check_finite(value, f"parameter {name!r}")
    metadata["checksum"] = _checksum(arrays)
    try:
        text = json.dumps(metadata, default=_to_json)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"save_checkpoint: hyperparameters and extra must be "
                              f"JSON-serialisable: {exc}") from None
    arrays[_METADATA] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    _write_atomically(path, arrays)


def load_checkpoint(path, model, optimizer=None, allow_non_finite=False):
    """Load a checkpoint written by :func:`save_checkpoint` into ``model`` (and ``optimizer``).

    Returns ``{"hyperparameters", "extra", "format_version", "minicavs_version"}``. Raises a
    :class:`CheckpointError` that says what is wrong if the file is missing, truncated or
    corrupt (its checksum does not match), of another format version, holds NaN or infinite
    values (unless ``allow_non_finite``), or does not match the model or optimiser (names,
    shapes, dtypes, optimiser type and state); in that case nothing has been changed.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"load_checkpoint: path must be a file path, got "
                              f"{type(path).__name__}")
    _check_objects("load_checkpoint", model, optimizer)
    path = os.fspath(path)
    arrays = _read(path)
    metadata = _metadata(path, arrays)
    _verify_checksum(path, arrays, metadata)
    params = _parameters(path, arrays, metadata)
    if not allow_non_finite:
        for name, value in params.items():
            _check_finite(value, f"parameter {name!r}", path)
    problems = state_mismatches(dict(model.named_parameters()), params)
    if problems:
        raise CheckpointError(f"checkpoint {path!r} does not match the model "
                              f"({type(model).__name__}):\n  " + "\n  ".join(problems))
    optimizer_state = None
    if optimizer is not None:
        optimizer_state = _optimizer_state(path, arrays, metadata)
        names = _optimizer_names(model, optimizer)
        if not allow_non_finite:
            for name, state in zip(names, optimizer_state["state"]):
                for key, value in state.items():
                    _check_finite(value, f"optimizer state {key!r} of {name}", path)
        problems = optimizer.state_mismatches(optimizer_state, names)
        if problems:
            raise CheckpointError(f"checkpoint {path!r}: the optimiser state does not match "
                                  f"{type(optimizer).__name__}:\n  " + "\n  ".join(problems))
    model.load_state_dict(params)
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state, names)
    return {key: metadata.get(key) for key in ("hyperparameters", "extra", "format_version",
                                               "minicavs_version")}


# --- writing ----------------------------------------------------------------------------------

def _check_objects(function, model, optimizer):
    from .optim import Optimizer

    if not isinstance(model, Module):
        raise CheckpointError(f"{function}: model must be a minicavs.nn.Module, got "
                              f"{type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise CheckpointError(f"{function}: optimizer must be a minicavs.nn optimiser (or "
                              f"None), got {type(optimizer).__name__}")


def _target(path):
    """The path to save to, checked before anything is written: a file name (not a
    directory) in a directory that exists."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise CheckpointError(f"save_checkpoint: path must be a file path, got {path!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CheckpointError(f"save_checkpoint: {path!r} is a directory; give a file name "
                              f"such as {os.path.join(path, 'model.npz')!r}")
    if not os.path.isdir(directory):
        raise CheckpointWriteError(errno.ENOENT, f"save_checkpoint: cannot write {path!r}: "
                                   f"its directory {directory!r} does not exist (create it "
                                   f"first)")
    return path


def _check_finite(value, what, path=None):
    value = np.asarray(value)
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        bad = int(value.size - np.isfinite(value).sum())
        if path is None:
            raise CheckpointError(f"save_checkpoint: {what} has {bad} non-finite value(s) (NaN "
                                  f"or inf) of {value.size}; refusing to save a diverged model")
        raise CheckpointError(f"checkpoint {path!r}: {what} has {bad} non-finite value(s) "
                              f"(NaN or inf) of {value.size}; refusing to load a diverged "
                              f"model (pass allow_non_finite=True to load it anyway)")


def _checksum(arrays):
    """SHA-256 of every array but the metadata: names, dtypes, shapes and bytes, in name
    order."""
    digest = hashlib.sha256()
    for name in sorted(k for k in arrays if k != _METADATA):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{value.dtype.str}\0{value.shape}\0".encode("utf-8"))
        digest.update(value.reshape(-1).view(np.uint8))
    return digest.hexdigest()


def _to_json(value):
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-serialisable")


def _write_atomically(path, arrays, function="save_checkpoint"):
    for key, value in arrays.items():
        if np.asarray(value).dtype.hasobject:  # np.savez would pickle it; np.load refuses that
            raise CheckpointError(f"{function}: array {key!r} has dtype object, which a "
                                  f"checkpoint cannot hold (it is never unpickled); convert "
                                  f"it to a numeric, bool or string array")
    directory = os.path.dirname(os.path.abspath(path))
    _remove_stale_temporaries(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}."
                                        f"{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    except OSError as exc:
        raise _write_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(temporary, path)
    except BaseException as exc:  # including KeyboardInterrupt: never leave the temporary behind
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, CheckpointError):
            raise _write_error(path, exc) from exc
        raise
    _fsync_directory(directory)


def _write_error(path, exc):
    reason = exc.strerror or str(exc)
    return CheckpointWriteError(exc.errno, f"save_checkpoint: cannot write {path!r}: {reason}; "
                                f"the previous file there (if any) is unchanged")


def _remove_stale_temporaries(path):
    """Remove the temporary files that saves to ``path`` left when their process was killed:
    ``.<name>.<pid>.<random>.tmp`` whose process no longer runs."""
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(f".{os.path.basename(path)}.") + r"(\d+)\.[0-9a-f]+\.tmp")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match and not _process_alive(int(match.group(1))):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass  # another save removed it first, or it is not ours to remove


def _process_alive(pid):
    if pid == os.getpid():
        return True  # a save in another thread of this process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process: leave its file alone
    return True


def _fsync_directory(directory):
    """Make the rename durable; a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- reading ----------------------------------------------------------------------------------

def _read(path):
    """Every array of the archive, read in full (so zip CRC checks run now, not later)."""
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path!r}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except Exception as exc:  # BadZipFile, ValueError, EOFError, zlib.error, OSError, ...
        raise CheckpointError(f"checkpoint {path!r} is truncated or corrupt and cannot be read "
                              f"({type(exc).__name__}: {exc})") from None


def _verify_checksum(path, arrays, metadata):
    expected = metadata.get("checksum")
    if expected is not None and _checksum(arrays) != expected:
        raise CheckpointError(f"checkpoint {path!r} is corrupt: its arrays do not match the "
                              f"checksum written with them (the file was damaged or edited "
                              f"after it was saved)")


def _metadata(path, arrays):
    if _METADATA not in arrays:
        raise CheckpointError(f"{path!r} is a .npz file but not a minicavs checkpoint (it has "
                              f"no {_METADATA!r} entry)")
    try:
        metadata = json.loads(arrays[_METADATA].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path!r}: the metadata is corrupt ({exc})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path!r} is not a minicavs checkpoint (its metadata does not "
                              f"say format {FORMAT!r})")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format version "
                              f"{metadata.get('format_version')!r}; this minicavs "
                              f"({__version__}) reads version {FORMAT_VERSION}")
    return metadata


def _parameters(path, arrays, metadata):
    """The parameter arrays, checked against the names, shapes and dtypes the metadata lists."""
    params = {}
    for entry in metadata["parameters"]:
        name, key = entry["name"], f"param/{entry['name']}"
        if key not in arrays:
            raise CheckpointError(f"checkpoint {path!r} is corrupt: parameter {name!r} is listed "
                                  f"but its array is missing")
        value = arrays[key]
        if list(value.shape) != entry["shape"] or str(value.dtype) != entry["dtype"]:
            raise CheckpointError(f"checkpoint {path!r} is corrupt: parameter {name!r} is listed "
                                  f"as {describe(entry['shape'])} {entry['dtype']} but stored as "
                                  f"{describe(value.shape)} {value.dtype}")
        params[name] = value
    stray = sorted(k for k in arrays if k.startswith("param/") and k[6:] not in params)
    if stray:
        raise CheckpointError(f"checkpoint {path!r} is corrupt: arrays {stray} are not listed in "
                              f"its metadata")
    return params


def _optimizer_state(path, arrays, metadata):
    saved = metadata.get("optimizer")
    if saved is None:
        raise CheckpointError(f"checkpoint {path!r} has no optimiser state (it was saved without "
                              f"an optimizer); pass optimizer=None to load only the model")
    state = []
    for i, keys in enumerate(saved["state"]):
        missing = [k for k in keys if f"optimizer/{i}/{k}" not in arrays]
        if missing:
            raise CheckpointError(f"checkpoint {path!r} is corrupt: optimiser state {missing} of "
                                  f"parameter {i} is listed but missing")
        state.append({k: arrays[f"optimizer/{i}/{k}"] for k in keys})
    return {"type": saved["type"], "hyperparameters": saved["hyperparameters"],
            "param_groups": saved.get("param_groups"), "state": state}


def _optimizer_names(model, optimizer):
    """A name for each of the optimiser's parameters, for messages: the model's dotted name."""
    names = {id(p): repr(name) for name, p in model.named_parameters()}
    return [f"parameter {names.get(id(p), i)}" for i, p in enumerate(optimizer.params)]


# --- mc.save / mc.load: any tree of state dicts ------------------------------------------------

_TREE = "__tree__"


def save(obj, path):
    """Write ``obj`` to ``path`` atomically: a state dict (``model.state_dict()``,
    ``optimizer.state_dict()``, a scheduler's) or any tree of dicts, lists and tuples whose
    leaves are arrays, Tensors, numbers, strings, booleans or None, e.g.
    ``mc.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, p)``.

    The file is an ``.npz`` of plain arrays plus the tree as JSON, so :func:`load` never
    unpickles anything. Tensors come back as NumPy arrays, tuples as lists; dict keys must be
    strings, and ``"__tree__"`` is reserved (it marks an array in the file). The file holds a
    SHA-256 checksum of its arrays: :func:`load` refuses one damaged or edited since."""
    path = os.fspath(path)
    arrays = {}

    def encode(value, where):
        if isinstance(value, dict):
            bad = [k for k in value if not isinstance(k, str)]
            if bad:
                raise CheckpointError(f"save: keys must be strings; {where or 'the top level'} "
                                      f"has key {bad[0]!r}")
            if _TREE in value:
                raise CheckpointError(f"save: key {_TREE!r} (at {where or 'the top level'}) is "
                                      f"reserved: it marks an array in the file, and would be "
                                      f"read back as one; rename it")
            return {k: encode(v, f"{where}/{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [encode(v, f"{where}/{i}") for i, v in enumerate(value)]
        if hasattr(value, "requires_grad") and hasattr(value, "numpy"):  # a Tensor
            value = value.numpy()
        if isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
            key = f"array/{len(arrays)}"
            arrays[key] = np.asarray(value.get() if hasattr(value, "get") else value)
            if arrays[key].dtype.hasobject:
                raise CheckpointError(f"save: {where or 'the object'} is an array of dtype "
                                      f"{arrays[key].dtype} (Python objects), which mc.save "
                                      f"does not pickle; convert it to a numeric, bool or "
                                      f"string array, or to lists")
            return {_TREE: key}
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise CheckpointError(f"save: {where or 'the object'} is a {type(value).__name__}; "
                              f"only dicts, lists, tuples, arrays, Tensors, numbers, strings, "
                              f"booleans and None can be saved")

    tree = encode(obj, "")
    text = json.dumps({"format": FORMAT + "-tree", "format_version": FORMAT_VERSION,
                       "minicavs_version": __version__, "tree": tree,
                       "checksum": _checksum(arrays)})
    arrays[_METADATA] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    _write_atomically(path, arrays, "save")


def load(path):
    """What :func:`save` wrote: the same tree, arrays as NumPy arrays (pass a model's part to
    ``model.load_state_dict``, an optimiser's to ``optimizer.load_state_dict``)."""
    path = os.fspath(path)
    arrays = _read(path)
    if _METADATA not in arrays:
        raise CheckpointError(f"{path!r} is a .npz file but not one written by mc.save")
    try:
        metadata = json.loads(arrays[_METADATA].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path!r}: the metadata is corrupt ({exc})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT + "-tree":
        raise CheckpointError(f"{path!r} was not written by mc.save (for save_checkpoint's "
                              f"files use load_checkpoint)")
    _verify_checksum(path, arrays, metadata)  # files written before the checksum: unverified

    def decode(value):
        if isinstance(value, dict):
            if set(value) == {_TREE}:
                if value[_TREE] not in arrays:
                    raise CheckpointError(f"{path!r} is corrupt: array {value[_TREE]!r} is "
                                          f"missing")
                return arrays[value[_TREE]]
            return {k: decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    return decode(metadata["tree"])
