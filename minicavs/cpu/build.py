"""Compiling generated C++ into a shared library, once: the native backend's code cache (and the
CUDA shim's: :func:`compile_library` serves both).

A source is compiled by the system compiler (``$CXX``, else ``g++``) with :data:`CXX_FLAGS` and
kept on disk under a hash of everything that decides the machine code — the source, the
compiler's version line, the flags and the CPU's feature flags (``-march=native`` code must not
run on another CPU) — as CuPy's kernel cache and TorchInductor's code cache do. A second run,
or a second process, finds the library and compiles nothing.

The cache is not trusted blindly (ccache does the same): every library ends in a trailer after
its ELF bytes (the loader ignores bytes past the sections) holding the full key it was built
for, the ELF size and its SHA-256. Before a cached library is loaded the trailer is read and
checked; a truncated, empty, junk, swapped (another key's library under this name),
unreadable or foreign-owned entry is rebuilt, with one warning naming the file. A library is
written to a unique ``.part`` file, fsync'ed, then renamed over its name, so a reader sees the
whole old file or the whole new one; ``.part`` files of killed compiles are removed by the next
compile: at once where their name's process (host and pid) is gone, else once older than
:data:`STALE_SECONDS`. The compiler runs under a time limit
(``MINICAVS_COMPILE_TIMEOUT`` seconds, default :data:`COMPILE_TIMEOUT`): a compiler that hangs
is killed, with its children, and the error says so and how to run without native code.

``MINICAVS_NATIVE`` takes ``0/false/no/off`` (the interpreter runs every vertex function) or
``1/true/yes/on``; any other value is an error naming the variable (:func:`unavailable`).
``MINICAVS_CACHE_DIR`` must name a folder this user can write (created if missing); a file or
an unwritable folder there is an error, not a silent move elsewhere.

**Fork.** libgomp's worker threads do not survive ``fork()``: a child whose forking thread ran
a parallel loop before the fork waits forever for them at its next parallel loop
(multiprocessing's ``fork`` context, DataLoader-style workers). An at-fork handler sets, in the
child, that thread's OpenMP thread count to 1: its loops then run serially and never touch the
dead pool (measured: the child hung before, finishes now with the parent's result). Threads the
child starts later make a pool of their own and run in parallel as usual. :func:`forked_child`
says whether this process is such a child.

The flags, and why:

* ``-O3 -march=native``: the loops are vectorised for this CPU (AVX2/AVX-512;
  ``MINICAVS_MARCH=x86-64-v3`` builds for AVX2 only, to measure that build on any machine);
* ``-fopenmp``: rows of a level are split between cores (``#pragma omp parallel for``), and
  ``#pragma omp simd`` loops call glibc's vector math (libmvec: ``_ZGVdN8v_expf`` is 8 ``expf``
  at once);
* ``-mprefer-vector-width=512`` where the kernels' target is AVX-512 (``cpu/isa.py``,
  :func:`cxx_flags`): 16 floats per vector, and libmvec's ``_ZGVeN16v_expf``; gcc picks
  256-bit vectors without it (``MINICAVS_CPU_TARGET=avx2`` keeps them there);
* ``-mtune=generic`` on x86 where the target is not AVX-512: the code is scheduled as the AVX2
  build's (``x86-64-v3``) is. Measured on a Zen 3 EPYC with gcc 12, whose own tuning re-reads
  an operand inside every FMA instead of once for a block of rows: the panel products 10-40 %
  slower ((16, 512) @ (512, 1280): 202 against 138 us), the level loop's few-row product 1.8x,
  TreeRNN's SST epoch 42-43 against 39 ms, Tree-LSTM 128's 165-173 against 161-162, the
  others equal. (An AVX-512 machine keeps its own tuning, as measured there.)
* ``-fno-math-errno -fno-trapping-math -D__FAST_MATH__``: what glibc's ``math.h`` needs to
  declare the vector variants of ``exp``/``tanh``/``log`` — *without* ``-ffast-math``, so NaN and
  infinity keep IEEE semantics, sums are not reassociated, and no ``crtfastmath.o`` is linked
  (it would set flush-to-zero for the whole Python process).

A source that does not compile raises :class:`~minicavs.errors.KernelCompileError` with the
compiler log and the source with line numbers; the generated source names, in comments, the
instruction each block came from.
"""

import atexit
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings

from .. import validate
from ..csource import numbered
from ..errors import ArgumentError, KernelCompileError, ToolchainError

CXX_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
             "-D__FAST_MATH__", "-fPIC", "-std=c++17", "-w")
# On a CPU with AVX-512, 512-bit vectors (and libmvec's 16-wide exp/tanh): gcc prefers 256
# otherwise. Measured on the fused gate groups of the Tree-LSTM (benchmarks, issue 22).
WIDE_VECTORS = ("-mprefer-vector-width=512",)
GENERIC_TUNING = ("-mtune=generic",)  # (x86 without AVX-512: see the module docstring)
LINK_FLAGS = ("-shared", "-fopenmp", "-lmvec", "-lm")
INSTALL_HINT = "install a C++ compiler (apt-get install g++), or set CXX to one"
OFF_HINT = "set MINICAVS_NATIVE=0 to run vertex functions on the NumPy interpreter instead"
COMPILE_TIMEOUT = 300.0  # seconds; the largest generated program compiles in about 10 s
VERSION_TIMEOUT = 30.0  # seconds for ``$CXX --version``
STALE_SECONDS = 3600.0  # a .part file this old belongs to a compile that was killed
CACHE_FORMAT = "minicavs-cache-2"  # part of every key: libraries of older layouts are not read
_MAGIC = b"\0MINICAVS-CACHE-ENTRY\0"
_TRAILER = len(_MAGIC) + 64 + 16 + 64  # magic, key, ELF size (hex), SHA-256 of the ELF bytes

_loaded_openmp = False  # a library using OpenMP was loaded in this process
_forked_after_openmp = False
_serial_in_child = None  # omp_set_num_threads of the loaded OpenMP runtime, for the child
_lock = threading.Lock()


# --- on or off, the compiler -------------------------------------------------------------------

def native_disabled():
    """True when ``MINICAVS_NATIVE`` switches native code off (``0/false/no/off``); an
    :class:`~minicavs.errors.ArgumentError` naming the variable for a value that is neither."""
    return not validate.env_flag("MINICAVS_NATIVE", True)


def unavailable():
    """Why no native code runs at all in this process (None: it can): ``MINICAVS_NATIVE`` is
    off, or no C++ compiler runs."""
    if native_disabled():
        return f"MINICAVS_NATIVE={os.environ['MINICAVS_NATIVE'].strip()} is set"
    try:
        compiler()
    except ToolchainError as exc:
        return str(exc)
    return None


def compiler():
    """``(path, version line)`` of the C++ compiler; raises :class:`ToolchainError` if there is
    none that runs."""
    return find_compiler("native code", INSTALL_HINT)


def find_compiler(user, hint):
    """``(path, version line)`` of ``$CXX``, else g++, for ``user`` (named in the error, with
    ``hint``). Shared by the native backend and the CUDA layer's CPU shim; probed once per
    value of ``$CXX``."""
    cxx = os.environ.get("CXX") or "g++"
    found = _probe(cxx)
    if isinstance(found, str):
        raise ToolchainError(f"{found.format(user=user)}; {hint}")
    return found


@functools.lru_cache(maxsize=None)
def _probe(cxx):
    """``(path, version)`` or an error message with ``{user}`` to fill in."""
    path = shutil.which(cxx)
    if path is None:
        return f"no C++ compiler for {{user}}: '{cxx}' was not found"
    try:
        done = _run([path, "--version"], VERSION_TIMEOUT)
        if done.returncode != 0:
            raise OSError(f"exit status {done.returncode}")
        return path, done.stdout.splitlines()[0]
    except subprocess.TimeoutExpired:
        return f"the C++ compiler '{path}' did not answer --version within {VERSION_TIMEOUT:g} s"
    except (OSError, IndexError) as exc:
        return f"the C++ compiler '{path}' does not run ({exc or 'no version line'})"


def compile_timeout():
    """Seconds a compile may take: ``MINICAVS_COMPILE_TIMEOUT``, else :data:`COMPILE_TIMEOUT`."""
    return validate.env_seconds("MINICAVS_COMPILE_TIMEOUT", COMPILE_TIMEOUT)


def _run(command, timeout, ahead=None):
    """``command``'s CompletedProcess (text output), killed with everything it started once
    ``timeout`` seconds pass (then TimeoutExpired): ``subprocess.run`` alone kills only the
    driver, and its ``cc1plus`` (or a script's ``sleep``) runs on."""
    if ahead is None:  # (a compile ahead's, stopped at exit: _stop_compiling_ahead)
        ahead = getattr(_ahead_thread, "on", False)
    with _lock:
        if ahead and _ahead_processes is None:  # (the process is ending: no compile ahead)
            return subprocess.CompletedProcess(command, -signal.SIGKILL, "", "stopped at exit")
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        if ahead:
            _ahead_processes.add(process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # the timeout, or an interrupt: leave no compiler running
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        process.communicate()
        raise
    finally:
        if ahead and _ahead_processes:
            _ahead_processes.discard(process)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


# --- where libraries live ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def cpu_signature():
    """The CPU's model and feature flags: part of the cache key of ``-march=native`` code."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "".join(lines)


def cache_dir(kind="native"):
    """Where compiled libraries of ``kind`` are kept: ``$MINICAVS_CACHE_DIR/<kind>``, else
    ``~/.cache/minicavs/<kind>``, else a per-user folder in the temp dir (the CUDA shim's
    kind is "shim"). A ``MINICAVS_CACHE_DIR`` that cannot be used (a file, a folder this user
    cannot write) is an :class:`ArgumentError` naming it."""
    chosen = os.environ.get("MINICAVS_CACHE_DIR", "").strip()
    if chosen:
        folder = os.path.join(chosen, kind)
        try:
            os.makedirs(folder, exist_ok=True)
            usable = os.access(folder, os.W_OK | os.X_OK)
            problem = None if usable else "this user cannot write there"
        except OSError as exc:
            problem = ("it is a file, not a folder" if os.path.isfile(chosen)
                       else exc.strerror or str(exc))
        if problem:
            raise ArgumentError(f"environment variable MINICAVS_CACHE_DIR={chosen!r} cannot "
                                f"hold compiled code: {problem}; point it at a folder this "
                                f"user can write (it is created if missing), or unset it")
        return folder
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else None
    candidates = [os.path.join(base, "minicavs", kind),
                  os.path.join(tempfile.gettempdir(), f"minicavs-{kind}-{uid or 'user'}")]
    for i, folder in enumerate(candidates):
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            # In the shared temp dir, a folder someone else made first is not ours to trust.
            if i == 1 and uid is not None and os.stat(folder).st_uid != uid:
                continue
            if os.access(folder, os.W_OK | os.X_OK):
                return folder
        except OSError:
            continue
    raise ToolchainError(f"no writable cache folder for compiled {kind} code (tried "
                         f"{candidates}); set MINICAVS_CACHE_DIR")


def cache_key(*parts):
    """The full key (64 hex digits) of a library built from ``parts``."""
    return hashlib.sha256("\0".join((CACHE_FORMAT, *parts)).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def cxx_flags():
    """:data:`CXX_FLAGS`, with :data:`WIDE_VECTORS` where the target is AVX-512 (else
    :data:`GENERIC_TUNING` on x86), and the
    ``-march`` of ``MINICAVS_MARCH`` where it is set (``x86-64-v3``: the AVX2 build any
    AVX-512 machine also runs, to measure it there; with ``MINICAVS_CPU_TARGET=avx2``)."""
    from . import isa

    march = os.environ.get("MINICAVS_MARCH", "").strip()
    flags = tuple(f"-march={march}" if f == "-march=native" and march else f for f in CXX_FLAGS)
    if isa.target() == "avx512":
        return flags + WIDE_VECTORS
    return flags + (GENERIC_TUNING if isa.x86() else ())


def library_path(source, tag):
    """The path of ``source``'s compiled library in the cache (it may not exist yet)."""
    return os.path.join(cache_dir(), f"{tag}-{_native_key(source)[:24]}.so")


def _native_key(source):
    _, version = compiler()
    return cache_key(source, version, cpu_signature(), *cxx_flags(), *LINK_FLAGS)


# --- the cache entry: the library and its trailer ------------------------------------------

def _trailer(key, body):
    return (_MAGIC + key.encode() + f"{len(body):016x}".encode()
            + hashlib.sha256(body).hexdigest().encode())


def entry_problem(path, key):
    """Why the cached library at ``path`` must not be loaded for ``key`` (None: it is sound)."""
    try:
        info = os.stat(path)
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return f"it belongs to another user (uid {info.st_uid})"
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if len(data) < _TRAILER or not data[-_TRAILER:].startswith(_MAGIC):
        return (f"it is {'empty' if not data else 'truncated or not a minicavs library'} "
                f"({len(data)} bytes, no cache trailer)")
    trailer = data[-_TRAILER:][len(_MAGIC):].decode("ascii", "replace")
    stored_key, size, digest = trailer[:64], trailer[64:80], trailer[80:]
    if stored_key != key:
        return f"it was built for another source (key {stored_key[:12]}..., wanted {key[:12]}...)"
    body = data[:-_TRAILER]
    if size != f"{len(body):016x}" or hashlib.sha256(body).hexdigest() != digest:
        return "its bytes do not match the checksum written with them"
    return None


def compile_library(source, tag, *, kind, key, commands, failure):
    """The path of ``source``'s library in the ``kind`` cache, compiled unless a sound entry
    of ``key`` is there: ``(path, compiled)``.

    ``commands(cpps, objs, out)`` gives the steps that make ``out`` from the source files
    ``cpps`` (one per unit of the source, see :data:`UNIT`; ``objs``: a scratch object file
    for each), each step a list of compiler command lines run side by side (a compile per unit,
    then the link); ``failure(log)`` the :class:`KernelCompileError` for a source that does not
    compile.
    """
    folder = cache_dir(kind)
    target = os.path.join(folder, f"{tag}-{key[:24]}.so")
    ahead = _ahead.get(target)
    if ahead is not None and ahead is not threading.current_thread():
        ahead.join()  # (being compiled ahead: its entry, then, or its error below)
    if os.path.lexists(target):
        problem = entry_problem(target, key)
        if problem is None:
            return target, False
        warnings.warn(f"minicavs: the cached library {target} is not sound ({problem}); "
                      f"rebuilding it", RuntimeWarning, stacklevel=3)
    _remove_stale_parts(folder)
    # Unique scratch names, then atomic renames: concurrent builds of one key (several
    # processes) never see each other's half-written files.
    units = units_of(source)
    cpp, partial = _scratch(folder, tag, ".cpp.part"), _scratch(folder, tag, ".so.part")
    cpps = [cpp] if len(units) == 1 else [_scratch(folder, f"{tag}{i}", ".cpp.part")
                                          for i in range(len(units))]
    objs = [_scratch(folder, f"{tag}{i}", ".o.part") for i in range(len(units))]
    scratch = list(dict.fromkeys([cpp, partial, *cpps, *objs]))
    try:
        _write_synced(cpp, source.encode())
        for path, unit in zip(cpps, units):
            if path != cpp:
                _write_synced(path, unit.encode())
        timeout = compile_timeout()
        for step in commands(cpps, objs, partial):
            try:
                results = _run_side_by_side(step, timeout)
            except subprocess.TimeoutExpired as expired:
                raise KernelCompileError(
                    f"the C++ compiler '{expired.cmd[0]}' did not finish compiling {tag!r} "
                    f"within {timeout:g} s (MINICAVS_COMPILE_TIMEOUT) and was stopped; give it "
                    f"longer with MINICAVS_COMPILE_TIMEOUT=<seconds>, or {OFF_HINT}",
                    source=source) from None
            for result in results:
                if result.returncode != 0:
                    raise failure((result.stderr or result.stdout).strip())
        with open(partial, "rb") as f:
            body = f.read()
        _write_synced(partial, body + _trailer(key, body))
        os.replace(cpp, target[:-3] + ".cpp")  # kept beside the library, for reading
        try:
            os.replace(partial, target)
        except OSError:  # a foreign file we may not replace: load a private copy, once
            os.replace(partial, private := _scratch(folder, tag, ".so.private"))
            warnings.warn(f"minicavs: cannot replace the cached library {target}; this "
                          f"process uses an uncached build", RuntimeWarning, stacklevel=3)
            return private, True
        _sync_folder(folder)
    finally:
        for path in scratch:
            if os.path.exists(path):
                os.remove(path)
    return target, True


# A line of a source that begins a unit compiled on its own, beside the others (``make -j``'s
# parallel objects, linked into one library): what comes before the first is each unit's
# preamble (its includes). cpu/kernel_source.py's kernels as one unit took 6.8 s on two
# cores, in five (two of shared kernels, one per instruction set's product) 4.1-4.4 s.
UNIT = "// minicavs: a unit of its own\n"


def units_of(source):
    """The translation units of ``source``: itself, or each unit after :data:`UNIT` with the
    preamble before the first."""
    preamble, *units = source.split(UNIT)
    return [preamble + unit for unit in units] if units else [source]


def _run_side_by_side(commands, timeout):
    """Each command's CompletedProcess, the commands run at once (:func:`_run` each; the first
    error raised once all have ended). Daemon threads: a compile ahead's are not waited for
    at exit, where :func:`_stop_compiling_ahead` stops their compilers."""
    if len(commands) == 1:
        return [_run(commands[0], timeout)]
    ahead = getattr(_ahead_thread, "on", False)  # (these threads are not the caller's)
    results, errors = [None] * len(commands), []

    def run(i, command):
        try:
            results[i] = _run(command, timeout, ahead)
        except BaseException as exc:  # noqa: BLE001 (raised below, in the caller's thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c), daemon=True)
               for i, c in enumerate(commands)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _scratch(folder, tag, suffix):
    # the writer's host and pid in the name: a later compile removes it once that pid is gone
    fd, path = tempfile.mkstemp(prefix=f"{tag}@{platform.node()}@{os.getpid()}@", suffix=suffix,
                                dir=folder)
    os.close(fd)
    return path


def _write_synced(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before a name points at them


def _sync_folder(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)  # the rename itself survives a crash
    except OSError:
        pass
    finally:
        os.close(fd)


def _writer_is_gone(name):
    """Whether the scratch file ``name`` was written by a process of this host that has ended
    (another host's pids cannot be asked: for them only the age tells)."""
    parts = name.split("@")
    if len(parts) < 4 or parts[1] != platform.node() or not parts[2].isdigit():
        return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        pass
    return False


def _remove_stale_parts(folder):
    """Remove scratch files of compiles that were killed: ``.part`` (and private ``.so``
    copies) whose writer's process has ended, or older than :data:`STALE_SECONDS` — a live
    compile is younger (time-boxed)."""
    cutoff = time.time() - max(STALE_SECONDS, 2 * compile_timeout())
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith((".part", ".so.private")):
            path = os.path.join(folder, name)
            try:
                if os.lstat(path).st_mtime < cutoff or _writer_is_gone(name):
                    os.remove(path)
            except OSError:
                pass  # another process removed it first


# --- compiling ahead -----------------------------------------------------------------------------

_ahead = {}  # library path -> the thread compiling it ahead (while it runs)
_ahead_thread = threading.local()  # .on in those threads
_ahead_processes = set()  # their compilers running now (None once the process is ending)
_ahead_threads = set()  # threads inside compiling_ahead(), joined at exit


def compile_ahead(source, tag, origin=""):
    """Start compiling ``source``'s library (:func:`build`'s) on a thread of its own, where the
    cache lacks it: one a job will load soon then compiles beside what the job compiles or
    runs now, as ``make -j`` would (a cold start of the Tree-LSTM's main job compiles four
    libraries, 10 s one after another on two cores). :func:`build` waits for it, and a
    failure is left to that call to raise, with its log. Returns the thread, or None (nothing
    to compile, or no native code here)."""
    if unavailable() is not None:
        return None
    key = _native_key(source)
    target = os.path.join(cache_dir("native"), f"{tag}-{key[:24]}.so")
    with _lock:
        if target in _ahead or (os.path.lexists(target) and entry_problem(target, key) is None):
            return None

        def run():
            try:
                with compiling_ahead():
                    _compile(source, tag, origin, key)
            except Exception:  # noqa: BLE001 (the load compiles again and raises it)
                pass
            finally:
                with _lock:
                    _ahead.pop(target, None)

        thread = _ahead[target] = threading.Thread(target=run, daemon=True,
                                                   name=f"minicavs-compile-{tag}")
        thread.start()  # (started before a waiter can see it)
    return thread


@contextlib.contextmanager
def compiling_ahead():
    """Inside, this thread compiles ahead of need (:func:`compile_ahead`'s threads, the CUDA
    kernels' workers of ``cuda/ahead.py``): at exit its compilers are stopped, not waited
    for, and the thread is given a moment to remove its scratch files."""
    thread = threading.current_thread()
    _ahead_thread.on = True
    with _lock:
        _ahead_threads.add(thread)
    try:
        yield
    finally:
        _ahead_thread.on = False
        with _lock:
            _ahead_threads.discard(thread)


@atexit.register
def _stop_compiling_ahead():
    """At exit, compiles ahead that nothing waited for stop (their libraries were not
    needed), their scratch files removed: no compiler outlives the process."""
    global _ahead_processes
    with _lock:
        running, _ahead_processes = _ahead_processes, None
        threads = list(_ahead.values()) + list(_ahead_threads)
    for process in running:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
    for thread in threads:
        thread.join(timeout=10)


# --- the native backend's build and load -------------------------------------------------------

def build(source, tag, origin=""):
    """Compile ``source`` (unless cached) and load it: ``(ctypes.CDLL, compiled)``, ``compiled``
    False when the library came from the cache. ``origin`` says, in an error, what the source
    was generated from."""
    # Idle OpenMP threads sleep instead of spinning on: spinning starves OpenBLAS's threads
    # (and other processes) on a machine with few cores. But they spin first (GOMP_SPINCOUNT
    # 10^6: 10-20 ms here), past the gaps of a step's Python between two team calls: waking a
    # sleeping thread cost more than the product (packed_gemm, 24 rows: 114 us a call asleep,
    # 69 us spinning, on the EPYC), and on a VM 0.24-0.44 ms a wake, where a spinning one took
    # 4-8 us (an Ice Lake Xeon under Firecracker). The autobatched taggers there: agenda+
    # 1.31x / 1.32x DyNet against 0.75x / 0.79x with 10^4 spins (a tenth of a millisecond);
    # the vertex runtime's few, large team calls unchanged; with other work on the cores the
    # teams shrink to the free ones (calibrate.free_cores), and no step slowed. Read when
    # libgomp loads, so set first.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", "1000000")
    path, compiled = _compile(source, tag, origin, _native_key(source))
    return load_openmp_library(path), compiled


def _compile(source, tag, origin, key, extra_flags=(), link_flags=LINK_FLAGS):
    """``compile_library`` of a C++ source into the native cache: (path, compiled)."""
    cxx, version = compiler()

    def commands(cpps, objs, out):
        return ([[cxx, *cxx_flags(), *extra_flags, "-x", "c++", "-c", "-o", obj, cpp]
                 for cpp, obj in zip(cpps, objs)], [[cxx, "-o", out, *objs, *link_flags]])

    def failure(log):
        return KernelCompileError(
            f"native code for {origin or tag} did not compile ({version}).\n"
            f"--- compiler log ---\n{log}\n--- generated source ---\n{numbered(source)}",
            log=log, source=source)

    return compile_library(source, tag, kind="native", key=key, commands=commands,
                           failure=failure)


_module_lock = threading.Lock()


def python_module(source, tag, origin):
    """``(library, None)`` for a C++ source against CPython's C API (:func:`python_library`,
    with the running interpreter's headers), or ``(None, why)`` where it cannot be built here
    — native code off, no headers, a failed compile — for its caller's Python path and for
    ``python -m minicavs doctor``."""
    reason = unavailable()
    if reason is not None:
        return None, reason
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"the interpreter's C headers (Python.h) are not in {include!r}"
    try:
        return python_library(source, tag, include, origin), None
    except Exception as exc:  # (the caller's Python path runs; the doctor says why)
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def python_library(source, tag, include, origin=""):
    """Compile ``source`` — C++ against CPython's C API, the running interpreter's headers in
    ``include`` — unless cached, and load it with ``ctypes.PyDLL``: its calls hold the GIL and
    raise the Python error they set. The key adds the interpreter's version and headers (the
    C API's layouts are theirs). Linked without OpenMP: loading it must not start libgomp
    before :func:`build` has set its environment."""
    key = cache_key(source, compiler()[1], cpu_signature(), sys.version, include,
                    *cxx_flags(), "-shared")
    with _module_lock:
        path, _ = _compile(source, tag, origin, key, (f"-I{include}",), ("-shared",))
        return _load(ctypes.PyDLL, path)


@functools.lru_cache(maxsize=None)
def module_library(source, tag, origin):
    """The library of a native module's fixed source (``cpu/kernels.py``, ``cpu/conv.py``),
    built or loaded once per process; None where native code is off."""
    if unavailable() is not None:
        return None
    with _module_lock:
        return build(source, tag, origin=origin)[0]


def load_openmp_library(path):
    """``ctypes.CDLL(path)`` for a library built with ``-fopenmp``, remembered for the fork
    handler; a private copy (see :func:`compile_library`) is unlinked once loaded."""
    global _loaded_openmp, _serial_in_child
    lib = _load(ctypes.CDLL, path)
    with _lock:
        if _serial_in_child is None:
            try:  # dlsym searches the library's dependencies: the OpenMP runtime it links
                _serial_in_child = lib.omp_set_num_threads
                _serial_in_child.argtypes, _serial_in_child.restype = [ctypes.c_int], None
            except AttributeError:
                pass
        _loaded_openmp = True
    return lib


def _load(kind, path):
    """``kind(path)`` (``ctypes.CDLL`` or ``PyDLL``); a private copy (see
    :func:`compile_library`) is unlinked once loaded."""
    try:
        lib = kind(path)
    except OSError as exc:
        raise ToolchainError(f"the compiled library {path} does not load ({exc}); remove it "
                             f"to rebuild, or {OFF_HINT}") from None
    if path.endswith(".so.private"):
        os.remove(path)  # mapped now; nothing else may load it
    return lib


def forked_child():
    """True in a process forked (``os.fork``, multiprocessing's ``fork`` context) after its
    parent loaded OpenMP code: the forking thread's native loops run on one core here (see the
    module docstring)."""
    return _forked_after_openmp


def _after_fork_in_child():
    global _forked_after_openmp
    if _loaded_openmp:
        _forked_after_openmp = True
        if _serial_in_child is not None:
            _serial_in_child(1)  # no parallel region touches the pool whose threads are gone


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
