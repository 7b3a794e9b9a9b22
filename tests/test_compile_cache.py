"""The compile cache and the native toolchain around it (issue 23, classes 2 and 3): a cached
library is checked against its key before it is loaded and rebuilt (one warning) when it is
not sound; stale scratch files go; a hanging compiler is stopped with a clear error;
``MINICAVS_NATIVE`` and ``MINICAVS_CACHE_DIR`` take only what they can mean; a process forked
after native code ran runs native code again instead of hanging.

Everything that could hang or crash runs in a subprocess with a short timeout."""

import os
import pathlib
import platform
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from minicavs.cpu import build
from minicavs.errors import ArgumentError, MinicavsError

ROOT = pathlib.Path(__file__).resolve().parent.parent
needs_native = pytest.mark.skipif(build.unavailable() is not None,
                                  reason=f"the native backend is off: {build.unavailable()}")


def _python(script, timeout, **env):
    """Run ``script`` in a fresh interpreter that imports this checkout's minicavs."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, env=environment, timeout=timeout, cwd=ROOT)


def _source(answer):
    return f'extern "C" int minicavs_answer(void) {{ return {answer}; }}\n'


# --- damaged entries ---------------------------------------------------------------------------

def _truncate(path, _other, rng):
    data = path.read_bytes()
    _rewrite(path, data[:rng.integers(1, len(data))])


def _empty(path, _other, _rng):
    _rewrite(path, b"")


def _junk(path, _other, rng):
    _rewrite(path, rng.integers(0, 256, 4096, dtype="uint8").tobytes())


def _flip_a_byte(path, _other, rng):
    data = bytearray(path.read_bytes())
    i = int(rng.integers(0, len(data)))
    data[i] ^= 0xFF
    _rewrite(path, bytes(data))


def _swapped(path, other, _rng):
    """Another key's library (F's under ∂F's key): a sound library, but not this one."""
    _rewrite(path, other.read_bytes())


def _foreign(path, _other, _rng):
    os.chown(path, 65534, 65534)  # nobody: whoever can write the folder may have planted it


def _unreadable(path, _other, _rng):
    os.chmod(path, 0)


def _rewrite(path, data):
    """New contents under the same name (a new file: the one already loaded stays mapped)."""
    scratch = path.with_suffix(".new")
    scratch.write_bytes(data)
    os.replace(scratch, path)


DAMAGE = {"truncated": _truncate, "empty": _empty, "junk": _junk, "one byte changed":
          _flip_a_byte, "swapped": _swapped}
if os.geteuid() == 0:
    DAMAGE["foreign-owned"] = _foreign
else:
    DAMAGE["unreadable"] = _unreadable

_LOAD_EACH = """
    import json, sys, warnings
    from minicavs.cpu import build
    warnings.simplefilter("always")
    results = []
    for answer in json.loads(sys.argv[1]):
        source = f'extern "C" int minicavs_answer(void) {{ return {answer}; }}\\n'
        runs = []
        for _ in range(2):  # rebuilt once (one warning), then from the cache, silently
            with warnings.catch_warnings(record=True) as caught:
                lib, compiled = build.build(source, "damaged")
            runs.append([lib.minicavs_answer(), compiled, [str(w.message) for w in caught]])
        results.append(runs)
    print(json.dumps(results))
"""


def _damage_and_reload(tmp_path, cases, seed):
    """Build one library per case here, damage each as its case says, then load them all in
    a fresh process: ``[(answer, compiled, warnings) for the two loads]`` per case."""
    import json

    import numpy as np

    rng = np.random.default_rng(seed)
    env = {"MINICAVS_CACHE_DIR": str(tmp_path)}
    answers = [1000 + i for i in range(len(cases))]
    script = ("import sys, json\nfrom minicavs.cpu import build\n"
              "for a in json.loads(sys.argv[1]):\n"
              "    build.build(f'extern \"C\" int minicavs_answer(void) {{ return {a}; }}\\n',"
              " 'damaged')\n")
    other = _source(999)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(answers + [999])],
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **env), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    os.environ["MINICAVS_CACHE_DIR"], before = str(tmp_path), os.environ.get(
        "MINICAVS_CACHE_DIR")
    try:
        paths = [pathlib.Path(build.library_path(_source(a), "damaged")) for a in answers]
        other_path = pathlib.Path(build.library_path(other, "damaged"))
    finally:
        if before is None:
            del os.environ["MINICAVS_CACHE_DIR"]
        else:
            os.environ["MINICAVS_CACHE_DIR"] = before
    for path, case in zip(paths, cases):
        DAMAGE[case](path, other_path, rng)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD_EACH),
                             json.dumps(answers)], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **env), timeout=120)
    assert result.returncode == 0, (f"loading damaged entries {cases} ended with status "
                                    f"{result.returncode}:\n{result.stderr[-2000:]}")
    return answers, json.loads(result.stdout)


def _check_rebuilt(answers, runs_per_case, cases):
    for answer, runs, case in zip(answers, runs_per_case, cases):
        (first, compiled, notes), (second, again, quiet) = runs
        assert first == answer and compiled, f"{case}: the damaged entry was used"
        assert len(notes) == 1 and "not sound" in notes[0] and "rebuilding" in notes[0], (
            case, notes)
        assert second == answer and not again and quiet == [], case


@needs_native
def test_every_kind_of_damaged_entry_is_rebuilt_with_one_warning(tmp_path):
    cases = list(DAMAGE)
    answers, runs = _damage_and_reload(tmp_path, cases, seed=0)
    _check_rebuilt(answers, runs, cases)
    notes = {case: run[0][2][0] for case, run in zip(cases, runs)}
    assert "another source" in notes["swapped"] and "empty" in notes["empty"]


@needs_native
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.sampled_from(sorted(DAMAGE)), min_size=1, max_size=3),
       seed=st.integers(0, 2**32 - 1))
def test_damage_at_random_places_never_loads(tmp_path_factory, cases, seed):
    tmp_path = tmp_path_factory.mktemp("cache")
    answers, runs = _damage_and_reload(tmp_path, cases, seed)
    _check_rebuilt(answers, runs, cases)


@needs_native
def test_stale_scratch_files_of_killed_compiles_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "native"
    folder.mkdir()
    old = [folder / name for name in ("levels-abc.so.part", "levels-abc.cpp.part",
                                      "levels-abc.o.part")]
    young = folder / "levels-def.so.part"  # a compile running now, in another process
    for path in old + [young]:
        path.write_bytes(b"half a library")
    two_hours_ago = time.time() - 7200
    for path in old:
        os.utime(path, (two_hours_ago, two_hours_ago))
    lib, compiled = build.build(_source(7), "fresh")
    assert compiled and lib.minicavs_answer() == 7
    assert not any(path.exists() for path in old) and young.exists()
    assert not [p for p in folder.iterdir() if p.name.startswith("fresh") and
                p.name.endswith(".part")]


@needs_native
def test_scratch_files_of_a_compile_whose_process_ended_are_removed_at_once(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    folder = tmp_path / "native"
    folder.mkdir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    host = platform.node()
    killed = folder / f"levels@{host}@{int(ended.stdout)}@x1.so.part"  # a compile killed now
    running = folder / f"levels@{host}@{os.getpid()}@x2.so.part"      # this live process's
    elsewhere = folder / f"levels@another-host@{int(ended.stdout)}@x3.so.part"
    for path in (killed, running, elsewhere):
        path.write_bytes(b"half a library")
    lib, compiled = build.build(_source(8), "again")
    assert compiled and lib.minicavs_answer() == 8
    assert not killed.exists() and running.exists() and elsewhere.exists()


# --- units side by side, libraries compiled ahead ----------------------------------------------

@needs_native
def test_a_source_in_units_compiles_them_side_by_side_into_one_library(tmp_path, monkeypatch):
    """Each unit (after ``build.UNIT``) with the preamble, compiled at once, linked as one
    library; the whole source is kept beside it; a unit that does not compile is named by its
    compiler's log."""
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    preamble = "#include <cstdint>\nstatic int64_t twice(int64_t x) { return 2 * x; }\n"
    units = [f'extern "C" int64_t unit_{k}(void) {{ return twice({k}); }}\n' for k in range(3)]
    source = preamble + "".join(build.UNIT + unit for unit in units)
    assert build.units_of(source) == [preamble + unit for unit in units]
    lib, compiled = build.build(source, "units")
    assert compiled and [getattr(lib, f"unit_{k}")() for k in range(3)] == [0, 2, 4]
    kept = list((tmp_path / "native").glob("units-*.cpp"))
    assert [p.read_text() for p in kept] == [source]
    assert not list((tmp_path / "native").glob("*.part"))
    broken = preamble + build.UNIT + units[0] + build.UNIT + "int64_t oops(void) { return x; }\n"
    with pytest.raises(MinicavsError, match="oops.*\n.*was not declared"):
        build.build(broken, "broken")
    assert not list((tmp_path / "native").glob("*.part"))


@needs_native
def test_a_library_compiled_ahead_is_loaded_without_compiling_it_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    thread = build.compile_ahead(_source(11), "ahead")
    assert thread is not None and build.compile_ahead(_source(11), "ahead") is None  # (once)
    lib, compiled = build.build(_source(11), "ahead")  # (waits for it)
    assert not compiled and lib.minicavs_answer() == 11
    assert build.compile_ahead(_source(11), "ahead") is None  # (in the cache now)
    bad = 'extern "C" int minicavs_answer(void) { return y; }\n'
    build.compile_ahead(bad, "bad_ahead")  # (its failure is the load's to raise, with the log)
    with pytest.raises(MinicavsError, match="was not declared in this scope"):
        build.build(bad, "bad_ahead")


_SLOW_COMPILER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "slow-c++ 1.0"; exit 0; fi
sleep 60
"""


def test_a_compile_ahead_nothing_waited_for_stops_at_exit(tmp_path):
    """A library compiled ahead that the process never loaded: its compiler is stopped when
    the process ends, and its scratch files are removed."""
    fake = tmp_path / "slow-c++"
    fake.write_text(_SLOW_COMPILER)
    fake.chmod(0o755)
    started = time.perf_counter()
    result = _python("""
        from minicavs.cpu import build
        units = "".join(build.UNIT + f'extern "C" int f{k}(void) {{ return {k}; }}\\n'
                        for k in range(2))  # (a unit's compiler is stopped too)
        print("AHEAD", build.compile_ahead(units, "unneeded") is not None)
        import time
        time.sleep(1)  # (its compilers running when the process ends)
        """, timeout=60, CXX=str(fake), MINICAVS_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0 and "AHEAD True" in result.stdout, result.stderr
    assert time.perf_counter() - started < 30
    assert not list((tmp_path / "native").glob("*.part"))
    assert not list((tmp_path / "native").glob("unneeded-*.so"))


# --- a compiler that hangs -----------------------------------------------------------------------

_HANGING_COMPILER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "hanging-c++ 1.0"; exit 0; fi
sleep 60   # a child holding the pipes, as cc1plus does under g++
"""


def test_a_hanging_compiler_is_stopped_with_a_clear_error(tmp_path):
    fake = tmp_path / "hanging-c++"
    fake.write_text(_HANGING_COMPILER)
    fake.chmod(0o755)
    started = time.perf_counter()
    result = _python("""
        import numpy as np
        import minicavs as mc
        from minicavs.errors import KernelCompileError
        F = mc.VertexFunction(lambda v: v.scatter(mc.tanh(v.pull() + v.gather(0))),
                              pull_shape=(2,), scatter_shape=(2,), arity=1, dtype="float64")
        try:
            F(mc.GraphBatch([mc.InputGraph.chain(3)]), pull=mc.tensor(np.ones((3, 2))))
        except KernelCompileError as exc:
            print("ERROR", exc)
        """, timeout=40, CXX=str(fake), MINICAVS_COMPILE_TIMEOUT="1",
        MINICAVS_CACHE_DIR=str(tmp_path))
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert message.startswith("ERROR"), message
    assert "within 1 s" in message and "MINICAVS_COMPILE_TIMEOUT" in message
    assert "MINICAVS_NATIVE=0" in message and str(fake) in message
    assert seconds < 30, f"the compile was not stopped in time ({seconds:.0f} s)"
    assert not list((tmp_path / "native").glob("*.part"))  # its scratch files went with it


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf", "nan"])
def test_a_bad_compile_timeout_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("MINICAVS_COMPILE_TIMEOUT", value)
    with pytest.raises(ArgumentError, match="MINICAVS_COMPILE_TIMEOUT"):
        build.compile_timeout()


# --- MINICAVS_NATIVE and MINICAVS_CACHE_DIR ----------------------------------------------------

_SPELLINGS = {"0": False, "false": False, "no": False, "off": False,
              "1": True, "true": True, "yes": True, "on": True}


def _with_env(name, value, fn):
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


@given(word=st.sampled_from(sorted(_SPELLINGS)), upper=st.lists(st.booleans(), max_size=5),
       pad=st.sampled_from(["", " ", "\t", "  "]))
def test_minicavs_native_takes_the_usual_spellings_of_on_and_off(word, upper, pad):
    spelled = "".join(c.upper() if i < len(upper) and upper[i] else c
                      for i, c in enumerate(word))
    reason = _with_env("MINICAVS_NATIVE", pad + spelled + pad, build.unavailable)
    if _SPELLINGS[word]:
        assert reason is None or "MINICAVS_NATIVE" not in reason
    else:
        assert reason == f"MINICAVS_NATIVE={spelled} is set"


@given(value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                     min_size=1, max_size=8))
def test_any_other_value_of_minicavs_native_is_an_error_naming_it(value):
    if value.strip().lower() in _SPELLINGS or not value.strip():
        return  # a real spelling, or unset: covered above
    with pytest.raises(ArgumentError) as info:
        _with_env("MINICAVS_NATIVE", value, build.unavailable)
    assert "MINICAVS_NATIVE" in str(info.value) and "0/false/no/off" in str(info.value)


def test_a_bad_minicavs_native_fails_the_call_not_silently_native(tmp_path):
    result = _python("""
        import numpy as np
        import minicavs as mc
        F = mc.VertexFunction(lambda v: v.scatter(mc.tanh(v.pull() + v.gather(0))),
                              pull_shape=(2,), scatter_shape=(2,), arity=1, dtype="float64")
        try:
            F(mc.GraphBatch([mc.InputGraph.chain(3)]), pull=mc.tensor(np.ones((3, 2))))
            print("ran", F.explain()["forward_backend"])
        except mc.MinicavsError as exc:
            print("ERROR", type(exc).__name__, exc)
        """, timeout=120, MINICAVS_NATIVE="of", MINICAVS_CACHE_DIR=str(tmp_path))
    assert result.stdout.startswith("ERROR ArgumentError"), result.stdout + result.stderr
    assert "MINICAVS_NATIVE='of'" in result.stdout


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_cache_dir_that_cannot_hold_libraries_is_an_error_naming_it(tmp_path, monkeypatch,
                                                                      where):
    file = tmp_path / "not-a-folder"
    file.write_text("")
    chosen = file if where == "a file" else file / "cache"
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(chosen))
    with pytest.raises(ArgumentError) as info:
        build.cache_dir()
    assert f"MINICAVS_CACHE_DIR={str(chosen)!r}" in str(info.value)
    assert isinstance(info.value, MinicavsError)


def test_a_cache_dir_that_does_not_exist_yet_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert build.cache_dir("shim") == str(tmp_path / "new" / "cache" / "shim")
    assert os.path.isdir(build.cache_dir("shim"))


@pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None, reason="no g++")
def test_the_cuda_shim_cache_is_checked_too(tmp_path, monkeypatch):
    from minicavs.cuda import shim

    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }'
    path = pathlib.Path(shim.ShimModule(source, tag="checked").path)
    _rewrite(path, b"junk")  # a new file: the loaded one stays mapped
    with pytest.warns(RuntimeWarning, match="not sound"):
        module = shim.ShimModule(source, tag="checked")
    assert module.path == str(path) and path.read_bytes() != b"junk"
    assert module.get_function("add_one").name == "add_one"


# --- fork after native code --------------------------------------------------------------------

_FORK = """
    import multiprocessing as mp, sys
    import numpy as np
    import minicavs as mc
    from minicavs.cpu import build

    rng = np.random.default_rng(0)
    H = 128  # 4096 rows of 128 columns: the loops run on every core (OpenMP)
    W = mc.Parameter(rng.standard_normal((8, H)).astype(np.float32))

    def cell(v):
        h = mc.tanh(v.pull() @ W + v.gather(0)) * mc.sigmoid(v.gather(0))
        v.scatter(h)
        v.push(h)

    F = mc.VertexFunction(cell, pull_shape=(8,), scatter_shape=(H,), push_shape=(H,), arity=1)
    batch = mc.GraphBatch([mc.InputGraph.chain(2) for _ in range(4096)])
    X = mc.tensor(rng.standard_normal((batch.num_vertices, 8)).astype(np.float32))

    def run():
        return float(F(batch, pull=X).numpy().sum()), F.explain()["forward_backend"]

    def child(queue):
        queue.put((run(), build.forked_child()))

    if __name__ == "__main__":
        parent = run()
        context = mp.get_context("fork")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        process.join(20)
        if process.is_alive():
            process.kill()
            print("HUNG")
            sys.exit(3)
        print((parent, build.forked_child(), queue.get()))
"""


@needs_native
def test_a_child_forked_after_native_code_runs_it_again(tmp_path):
    script = tmp_path / "fork_after_native.py"
    script.write_text(textwrap.dedent(_FORK))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=90, cwd=ROOT)
    assert "HUNG" not in result.stdout, "the forked child hung in its first parallel loop"
    assert result.returncode == 0, result.stderr
    parent, forked_parent, (child, forked_child) = eval(result.stdout)  # noqa: S307 (ours)
    # (the child runs on one thread, its product as one NumPy call, the parent's split between
    # the team: float32 sums in another order, equal to rounding)
    assert child[1] == parent[1] == "native"
    assert child[0] == pytest.approx(parent[0], rel=1e-6)
    assert not forked_parent and forked_child
