"""Own kernel or NumPy's BLAS: decided by measuring both here, once per CPU and BLAS.

Where the library has a kernel of its own for a product (panels packed once, a team of
one-thread gemms: ``cpu/products.py``), which is faster depends on the CPU, its vector width,
the BLAS and the shape; a crossover constant measured on one machine was wrong on the next (on
an AVX2 EPYC the panels ran 4-20x slower than the BLAS where an AVX-512 machine had them
faster). So the first product of each kind of shape (a *bucket*: sizes rounded up to powers
of two, but a weight's own sizes and a few rows' count, where the BLAS's time jumps between
neighbouring shapes: ``products.rows_key``) runs both ways, interleaved, best of a few (a few
milliseconds), and the faster one runs that bucket from then on. The measurements are kept in the native cache folder, in a
file named by the CPU's model and flags, the BLAS (its file and configuration), the target
(``cpu/isa.py``), the cores and the kernels' source, so a new CPU, BLAS or kernel measures
again; ``python -m minicavs doctor`` prints them. One taken while other work held the cores it
needed (:func:`free_cores`) decides for this process only.

``MINICAVS_KERNELS``: ``measure`` (the default), ``own`` or ``blas`` forces every choice
(tests force ``own`` to check the kernels whatever this machine prefers).
"""

import atexit
import ctypes
import functools
import json
import os
import tempfile
import threading
import time

import numpy as np

from ..errors import ArgumentError
from . import blas, build, isa
from .kernel_source import SOURCE
from .team import in_team_products, one_blas_thread, state as team_state, team_size

ENVIRONMENT = "MINICAVS_KERNELS"
CHOICES = ("measure", "own", "blas")
ROUNDS = (2, 9)  # timed rounds of each: at least, at most
# The own kernel must beat the BLAS by this much: closer, the two are equal within the noise
# of a shared machine (repeated measurements of one pair differ by several percent), and the
# BLAS is kept. A product of a few microseconds must also gain MIN_GAIN: two such calls timed
# at once differ by a microsecond or two (seen, the level loop's panels of 2 x 256 x 640 chosen
# at 9.9 us against the gemm's 11.6, then timed at 14 against 11 beside it), which a ratio
# alone reads as a clear win.
MARGIN = 0.95
MIN_GAIN = 2e-6  # seconds
# Own ÷ BLAS between these is a close call: measured a second time (the best of both kept),
# and a third time by a later process. One sample of a large product decided alone (seen: the
# team's Xᵀ·G of a Tree-FC batch timed at 52.6 ms against BLAS's 53.8 — BLAS on one thread; the
# team runs it in 27-35 ms), and two looks a moment apart can both be disturbed (seen: six
# team products of a Tree-LSTM kept at 0.99-1.02x the one-thread BLAS after two looks; measured
# again, 0.5x). A loss is looked at the same way: the own side is the one a busy moment hits
# hardest (a team waits for its slowest member; seen: a team product of Tree-FC kept at 0.76x
# the one-thread BLAS, 38 ms against 28.8, where it runs in 12). A clear win at one look gets a
# second, by a later process (_clear_win_of_one_look_elsewhere). A team against one thread
# still close after LOOKS looks gets one more from every process that asks, until it is not:
# a team of one-thread gemms of the same BLAS is close to one thread of it only where the
# work is too small to split, or where its cores were not free at every look (seen: the team's
# Xᵀ·G of a Tree-LSTM's joined batches kept at 0.98x the one-thread BLAS after three looks,
# 10.9 ms against 11.2; looked at again, 7.0 against 13.8: one thread had run them at half
# the team's speed, the autobatched step 12 % slower). Between two choices on the same cores
# (panels or the team, MKL or OpenBLAS) a close call is what it says, and is not looked at
# past LOOKS (in every process, those looks cost 0.65 s of a Tree-LSTM's first step).
CLOSE = (0.8, 1.25)
LOOKS = 3
BUDGET = 0.01  # seconds of timed rounds after which no more are started (past the minimum)
# How choices are measured, in the file's key: a change measures every choice again (2: the
# BLAS side of the few-rows kernel called directly, as the level loop calls it).
METHOD = "2"

_lock = threading.Lock()
_table = None  # name -> [own s, BLAS s] (+ [looks] once measured again), read on first use
_looked_here = set()  # names measured by this process (a later look is another process's)
SAVE_EVERY = 1.0  # seconds between two writes of the file (:func:`_save`)
_unsaved = {}  # name -> times measured by this process, not yet written
_saved_at = float("-inf")  # time.monotonic() of the last write (none yet)


def forced():
    """``"own"``, ``"blas"``, or None (measure): ``MINICAVS_KERNELS`` — inside a call's
    ``products.team_products`` block, as it was when the block began (asked hundreds of times
    a step, a read of the environment cost 1-2 µs)."""
    pinned = getattr(team_state, "kernels", None)
    if pinned is not None:
        return pinned[0]
    return read_forced()


def read_forced():
    """:func:`forced`, read from the environment now."""
    value = os.environ.get(ENVIRONMENT, "").strip().lower() or "measure"
    if value not in CHOICES:
        raise ArgumentError(f"environment variable {ENVIRONMENT}={value!r} is not one of "
                            f"{', '.join(CHOICES)}")
    return None if value == "measure" else value


def own_is_faster(name, make, threads=1, source=None, apart=False, against_one=False):
    """Whether the library's kernel (on ``threads`` threads) runs the bucket ``name`` faster
    than NumPy's BLAS: measured now, ``make()`` giving the two calls ``(own, blas)``, unless
    already measured on this CPU and BLAS. ``source``: the C++ of a kernel outside
    ``kernel_source.py`` (which keys the whole file), so that a change of it measures again.
    ``apart``: each call measured in rounds of its own, not in turns (:func:`times`).
    ``against_one``: a team against one thread, whose close call is looked at again by every
    process until it is not (see :data:`CLOSE`)."""
    force = forced()
    if force is not None:
        return force == "own"
    found = times(name, make, threads, source, apart=apart)
    close = is_close(found)
    if close or not wins(found) or _clear_win_of_one_look_elsewhere(_named(name, source)):
        found = times(name, make, threads, source, again=True, apart=apart,
                      past_looks=close and against_one)
    return wins(found)


def is_close(times):
    """Whether measured ``(own, BLAS)`` seconds are a close call (:data:`CLOSE`)."""
    return CLOSE[0] < times[0] / max(times[1], 1e-12) < CLOSE[1]


def _clear_win_of_one_look_elsewhere(name):
    """Whether ``name``'s own kernel won clearly at one look, taken by another process: it is
    looked at once more (the best of both kept). One slow moment of the BLAS side decided for
    good before (seen: panels of 4 x 256 x 640 kept at 1.42x, BLAS timed at 27 us where it runs
    in 16-17: the panels, 17, then lost 0.79x to it in use)."""
    found = _load().get(name)
    return found is not None and (len(found) < 3 or found[2] < 2) and name not in _looked_here


def _named(name, source):
    """A bucket's name in the table: with the digest of its kernel's ``source`` where given."""
    return name if source is None else f"{name} #{build.cache_key(source)[:8]}"


def times(name, make, threads=1, source=None, busy_decides=True, again=False, apart=False,
          past_looks=False):
    """The best seconds ``[first, second]`` of the two calls ``make()`` gives, measured now
    unless already on this CPU and BLAS (kept as :func:`own_is_faster` keeps them). One taken
    while other work held its cores decides for this process only, or with ``busy_decides=False``
    not even that: :class:`Busy` is raised. ``again``: measured once more — a second look now,
    a third by a later process (:data:`LOOKS`) — each call's best of all kept; ``past_looks``:
    also after :data:`LOOKS`, once a process."""
    name = _named(name, source)
    table = _load()
    found = table.get(name)
    looks = 1 if found is None or len(found) < 3 else found[2]
    if found is None or (again and (looks < LOOKS or past_looks)
                         and (looks < 2 or name not in _looked_here)):
        quiet = _quiet(threads)
        if not quiet and not busy_decides:
            raise Busy(name)  # (not measured: it would not count)
        # (apart: a team's threads spin a while after its call; NumPy's BLAS threads timed
        # right after it would share the cores with them — 2x slower, measured — where in use
        # the two do not alternate. A call's warm-up outlasts the spin.)
        fresh = [measure(call)[0] for call in make()] if apart else measure(*make())
        found = fresh if found is None else \
            [min(a, b) for a, b in zip(found, fresh)] + [looks + 1]
        _looked_here.add(name)
        quiet = _quiet(threads)
        if not quiet and not busy_decides:
            raise Busy(name)
        with _lock:  # (another thread may be adding its own, or reading them all)
            table[name] = found
            _drop_older(table, name)
        if quiet:
            _save(name, found)
    return found[:2]


def _quiet(threads, tries=5):
    """Whether ``threads`` cores are free (:func:`free_cores`), asked again a millisecond later
    up to ``tries`` times: right after a team's call its members may still be running, or
    fall asleep between the two reads of ``/proc`` (seen here: one free core of two for about
    a millisecond after the probe, then two), which is not other work."""
    for attempt in range(tries):
        if free_cores() >= threads:
            return True
        if attempt + 1 < tries:
            time.sleep(0.001)
    return False


class Busy(Exception):
    """A measurement was taken while other work held the cores it needed."""


# --- from how much work a team of threads pays ------------------------------------------------
# Waking a team (an OpenMP region: on every member, then a barrier) costs a time that depends on
# the CPU, its cores and the wait policy (members sleep between regions here: cpu/build.py); below
# some work one thread finishes first. So the work from which a loop splits is measured, not
# fixed: the probe (a gate-like element-wise pass in 8 loops, each ending at a barrier, as a
# level's instructions do: ``team_probe`` in kernel_source.py) on the team against one thread, at
# 2^10, 2^11, ... elements until the team wins twice in a row (a loss or close call looked at
# again, as every choice is).
SPLIT_PROBE = range(10, 23)
SPLIT_FIRST = 1 << SPLIT_PROBE[0]


def split_elements(threads):
    """Elements of element-wise work from which a team of ``threads`` runs it faster than one
    thread here (the first power of two where it wins, and at the next), or None: never up to
    2^22, one thread, or no native code. ``MINICAVS_KERNELS=own``: from the first (tests run the
    teams); ``blas``: never."""
    return _split(threads, forced())[0]


def split_rate(threads):
    """``(split, per element, per multiply-add)``: :func:`split_elements` and the seconds of one
    thread's element of the probe and multiply-add of the BLAS (a (64, 256) x (256, 256) float32
    product), which turn a level's mix of products and element-wise work into elements; None
    where no team splits. Forced (``MINICAVS_KERNELS``), a multiply-add counts as an element."""
    return _split(threads, forced())[1]


def split_measured(threads):
    """Whether this process knows the split of a team of ``threads`` (measured, read from the
    file or forced): until then loops run on one thread, and that says nothing of the team."""
    return (threads, forced()) in _splits


def threads_for(elements):
    """The threads of a loop over ``elements`` of element-wise work: the team
    (``team.team_size``) from :func:`split_elements`, else one; outside a call of native loops
    (whose team is the cores free when it began) only the cores free now — a member waiting
    for a core that other work holds costs a timeslice (measured: cross-entropy of 2,400 x 5,
    40 us on two threads, 700 us with the other core busy, 75 us on one)."""
    threads = team_size()
    split = split_elements(threads) if threads > 1 else None
    if split is None or elements < split:
        return 1
    return threads if in_team_products() else min(threads, free_cores())


_splits = {}  # (threads, MINICAVS_KERNELS) -> (split_elements, split_rate)
_retry = {}  # (threads, MINICAVS_KERNELS) -> when a measurement is tried again (time.monotonic)
RETRY_SECONDS = 10.0


def _split(threads, force):
    """``(split_elements, split_rate)`` for a team of ``threads`` under ``MINICAVS_KERNELS``
    ``force``: read from the file of measurements, or measured (and kept there) at a moment
    when no other work holds the team's cores. Until then no loop splits — inside a call of native
    loops, the team is the free cores anyway (``team.team_size``) — and a measurement that other
    work disturbed is tried again :data:`RETRY_SECONDS` later, not kept: a process that started
    on a busy machine still finds its team when the machine is quiet."""
    key = (threads, force)
    found = _splits.get(key)
    if found is not None:
        return found
    if threads < 2 or _probe() is None:
        found = None, None
    elif force is not None:  # (nothing measured: own splits from the first size, blas never)
        found = (SPLIT_FIRST, (SPLIT_FIRST, 1.0, 1.0)) if force == "own" else (None, None)
    elif time.monotonic() < _retry.get(key, 0.0):
        return None, None
    else:
        try:
            found = _measure_split(threads)
        except Busy:
            _retry[key] = time.monotonic() + RETRY_SECONDS
            return None, None
    _splits[key] = found
    return found


def _measure_split(threads):
    probe = _probe()
    won = []
    for e in SPLIT_PROBE:
        n = 1 << e
        name, make = f"team split <={n} elements ({threads} threads)", \
            lambda: (probe(n, threads), probe(n, 1))
        found = times(name, make, threads, busy_decides=False)
        close = is_close(found)
        if not wins(found) or close:
            # A loss or a close call is looked at again, now and by a later process, the best
            # of each side kept, as every choice is (own_is_faster): the team's side is the
            # one a slow moment of a shared core hits. Kept after one look, such a moment
            # set the split for good (seen: 2^17 on this VM, the team's probe 2x slower at
            # every size below; looked at again, 2^12-2^13, and the autobatched tagger's
            # steps 3 % faster with it). Where other work holds the cores now, the first
            # verdict stands.
            try:
                found = times(name, make, threads, busy_decides=False, again=True,
                              past_looks=close)
            except Busy:
                pass
        won.append(wins(found))
        if won[-2:] == [True, True]:
            break
    else:
        return None, None
    split = n // 2
    a, b = np.ones((64, 256), np.float32), np.ones((256, 256), np.float32)
    gemm, element = times("team split: product 64x256x256, probe 65536 (1 thread)",
                          lambda: (lambda: _one_thread_product(a, b), probe(1 << 16, 1)),
                          busy_decides=False)
    return split, (split, element / (1 << 16), gemm / (64 * 256 * 256))


# --- the gemm the library's own products call ----------------------------------------------
# NumPy's BLAS, or MKL where installed (cpu/blas.py), whichever runs these one-thread products
# faster here — a level's product, a batch's and a parameter's gradient (A transposed), as
# (A transposed, m, k, n). (Measured on an Ice Lake server: MKL 1.1-1.9x OpenBLAS on each.)
GEMM_SHAPES = ((False, 16, 256, 640), (False, 256, 256, 640), (True, 256, 1024, 640))


def gemm(dtype):
    """``(address, interface, name)`` of the one-thread gemm for ``dtype`` that the level loops
    and the team's products call: MKL's where it is installed and measured faster here than
    NumPy's BLAS (on float32; float64 follows, so a Program's loop has one interface), else
    NumPy's (:func:`blas.gemm`). ``MINICAVS_KERNELS``: ``own`` takes MKL where installed,
    ``blas`` NumPy's."""
    return _gemm(np.dtype(dtype), forced())


@functools.lru_cache(maxsize=None)
def _gemm(dtype, force, routine="gemm"):  # (called at every team product: looked up once)
    if _mkl_chosen(force):
        return blas.mkl_gemm(dtype, routine) + ("MKL",)
    return blas.gemm(dtype, routine) + ("NumPy's BLAS",)


def gemv(dtype):
    """``(address, interface, name)`` of the gemv of :func:`gemm`'s library (address None
    where it has none): a level loop's product of one row calls it where its own kernel is not
    faster (``runtime/native.py``)."""
    return _gemm(np.dtype(dtype), forced(), "gemv")


@functools.lru_cache(maxsize=None)
def _mkl_chosen(force):
    numpy_gemm, mkl_gemm = blas.gemm("float32"), blas.mkl_gemm("float32")
    if mkl_gemm is None or not numpy_gemm[1].startswith("cblas") or _probe() is None:
        return False
    # (A loss is looked at again, as every one is: seen here, MKL at 12.3 ms against 5.4 in a
    # first look, 5.0 against 6.7 in each of six after it.)
    name = f"gemm float32 (1 thread): MKL ({blas.mkl_identity()}) against NumPy's BLAS"
    with one_blas_thread():
        return own_is_faster(name, lambda: (_gemm_calls(mkl_gemm), _gemm_calls(numpy_gemm)))


def _gemm_calls(gemm):
    """A call running :data:`GEMM_SHAPES` in float32 with ``gemm`` (an ``(address,
    interface)``) on one thread."""
    rng = np.random.default_rng(0)
    calls = []
    for transposed, m, k, n in GEMM_SHAPES:
        a = rng.standard_normal((k, m) if transposed else (m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        calls.append(one_thread_gemm(gemm, a.T if transposed else a, b, np.empty((m, n),
                                                                                 np.float32)))

    def run():
        for call in calls:
            call()
    return run


def one_thread_gemm(gemm, a, b, out):
    """A call of ``out = a @ b`` straight to ``gemm`` (an ``(address, interface)``, a CBLAS's),
    as a level loop calls it — on one thread where the caller set the BLAS so
    (:func:`team.one_blas_thread`; MKL's is sequential): 2-D arrays of float32 or float64 read
    as ``blas.operand`` reads them, ``out`` C-contiguous (the call keeps them alive).
    (Through ``team_gemm`` a one-row product took 6 us more: 15.9 against 9.4.)"""
    address, interface = gemm
    integer = ctypes.c_int64 if interface == "cblas64" else ctypes.c_int
    real = ctypes.c_float if out.dtype == np.float32 else ctypes.c_double
    pointer = ctypes.c_void_p
    function = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer,
                                integer, real, pointer, integer, pointer, integer, real, pointer,
                                integer)(address)

    (m, k), n = a.shape, b.shape[1]
    (ta, lda, a), (tb, ldb, b) = blas.operand(a), blas.operand(b)
    args = (101, 112 if ta else 111, 112 if tb else 111, m, n, k, 1.0, a.ctypes.data, lda,
            b.ctypes.data, ldb, 0.0, out.ctypes.data, n)  # (row-major; transposed or not)
    return lambda keep=(a, b, out, function): function(*args)


def one_thread_gemv(gemv, x, w, out):
    """A call of ``out = x @ w`` for one row ``x`` (1 x k) straight to ``gemv`` (an ``(address,
    interface)``, a CBLAS's), as a level loop calls it: ``w`` read as :func:`blas.operand`
    reads it, ``out`` (1 x n) C-contiguous."""
    address, interface = gemv
    integer = ctypes.c_int64 if interface == "cblas64" else ctypes.c_int
    real = ctypes.c_float if out.dtype == np.float32 else ctypes.c_double
    pointer = ctypes.c_void_p
    function = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, integer, integer, real,
                                pointer, integer, pointer, integer, real, pointer,
                                integer)(address)
    transposed, ldw, w = blas.operand(w)
    k, n = x.shape[1], out.shape[1]
    # (row-major w (k x n): out = wᵀ x; w stored transposed (n x k): out = w x)
    args = (101, 111 if transposed else 112, n if transposed else k, k if transposed else n,
            1.0, w.ctypes.data, ldw, x.ctypes.data, 1, 0.0, out.ctypes.data, 1)
    return lambda keep=(x, w, out, function): function(*args)


def _one_thread_product(a, b):
    with one_blas_thread():  # (as a level loop's team member calls it)
        return a @ b


@functools.lru_cache(maxsize=None)
def _probe():
    """``probe(n, threads)``: a call running the probe over ``n`` elements; None without native
    code."""
    if build.unavailable() is not None:
        return None
    function = build.module_library(SOURCE, "kernels", "minicavs/cpu/kernels.py").team_probe
    function.restype = None
    function.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int]

    def probe(n, threads):  # (its arrays live as long as the call: a measurement's time)
        arrays = [np.full(n, v, np.float32) for v in (1, 0.5, 0)]
        a, b, out = (x.ctypes.data for x in arrays)
        return lambda keep=arrays: function(a, b, out, n, threads)
    return probe


def _drop_older(table, name):
    """(Under ``_lock``.) Forget the measurements of an earlier source of ``name``'s kernel
    (same name, another digest): they no longer say anything, and doctor would show them."""
    base = name.split(" #")[0]
    for old in [k for k in table if k != name and k.split(" #")[0] == base and " #" in k]:
        del table[old]


def wins(times):
    """Whether measured ``(own, BLAS)`` seconds choose the own kernel."""
    return times[0] < MARGIN * times[1] and times[1] - times[0] > MIN_GAIN


def free_cores():
    """The cores of this process (``team.team_size``) that no other work is running on now
    (``/proc/loadavg``'s runnable count, less this process's own running threads: a team's
    members still spinning after its last loop are not other work). A team larger than that
    waits at each product for a member the other work holds off its core (two cores, one
    busy: 0.35-0.8 ms for any team product against 17-220 us idle), so teams are sized to
    it, and a measurement taken with fewer free cores than its threads decides for this
    process but is not kept for the next. Every core where a choice is forced (tests: one
    path, whatever else runs).

    A reading that found every core free stands for :data:`FREE_SECONDS` (a Tree-LSTM epoch
    asks fifty times, a reading cost 116 us there: 5.6 ms of its 220, 1.0 ms with the moment);
    one that found other work does not, so on a busy machine every call reads."""
    if forced() is not None:
        return team_size()
    now = _now()
    if now < _all_free_until[0]:
        return team_size()
    free = _read_free_cores()
    if free >= team_size():
        _all_free_until[0] = now + FREE_SECONDS
    return free


FREE_SECONDS = 0.05
_all_free_until = [0.0]  # (_now) until which the last reading stands
_now = time.monotonic


def _read_free_cores():
    """:func:`free_cores` as read now."""
    running = _running()
    if running is None:
        return team_size()
    if running > 1:  # (alone, the one runnable thread is this one: no /proc/self reads)
        # This process's threads read before and after a second count: a team member that
        # falls asleep or wakes between the reads is this process's, not other work (read
        # once after, such a member sized an autobatched block to one thread on a quiet
        # machine: one block of twenty in 3 of 4 ten-step runs).
        before = _own_running()
        running = _running() or running
        others = running - max(before, _own_running())
        return max(1, team_size() - max(0, others))
    return team_size()


def free_cores_for_a_call(reads=3, pause=1e-4):
    """:func:`free_cores` for a team that runs a whole call: where other work shows, looked
    at again up to ``reads`` times ``pause`` seconds apart, the most free cores seen. A thread
    that runs for a moment (the kernel's, a monitor's) put a whole call on one thread: 1 in 24
    calls of a Tree-FC epoch on the quiet VM here, ~50 ms an epoch; work that holds a core
    shows in every read. Other work seen in every read stands for :data:`FREE_SECONDS` too:
    read anew at every call, a busy machine's Tree-LSTM 128 step spent 1.3 ms of 14 in the
    reads' pauses (a sleep there returns late) and 0.5 ms reading ``/proc``."""
    if forced() is None:
        now = _now()
        if now < _busy_until[0]:
            return _busy_until[1]
    free = free_cores()
    for _ in range(reads - 1):
        if free >= team_size():
            break
        time.sleep(pause)
        free = max(free, free_cores())
    if free < team_size():
        _busy_until[:] = [_now() + FREE_SECONDS, free]
    return free


_busy_until = [0.0, 1]  # (_now) until which other work seen in every read stands, and its count


def _running():
    """The system's runnable threads now (``/proc/loadavg``), or None where it cannot be read."""
    try:
        return int(_kernel_file("/proc/loadavg").split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _own_running():
    """This process's threads that are running or runnable now (this one among them)."""
    count = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for task in tasks:
        try:
            state = _kernel_file(f"/proc/self/task/{task}/stat").rpartition(b")")[2].split()[0]
            count += state == b"R"
        except (OSError, IndexError):
            pass
    if len(_opened) > 2 * len(tasks) + 8:  # (threads come and go: forget the ended ones')
        _forget_ended(tasks)
    return max(1, count)


# Kernel files read at every call of a native team: each stays open and is read again from
# its start (a kernel file is made anew at each read). Opening one cost 16-70 us here, a read
# 2; free_cores reads one to six of them. path -> (pid, descriptor).
_opened = {}


def _kernel_file(path):
    pid = os.getpid()
    found = _opened.get(path)
    if found is None or found[0] != pid:  # (first use, or a forked child: its own descriptor)
        found = _opened[path] = (pid, os.open(path, os.O_RDONLY))
    try:
        return os.pread(found[1], 512, 0)
    except OSError:  # (the thread of a task's file ended: open it again next time)
        _close(path)
        raise


def _close(path):
    pid, fd = _opened.pop(path, (None, None))
    if pid == os.getpid():
        try:
            os.close(fd)
        except OSError:
            pass


def _forget_ended(tasks):
    alive = {f"/proc/self/task/{task}/stat" for task in tasks}
    for path in [p for p in list(_opened) if p.startswith("/proc/self/task/")  # (list():
                 and p not in alive]:  # one step under the GIL, while other threads add)
        _close(path)


def measure(*calls):
    """The best time (seconds) of each of ``calls``, run in turns after one warm-up each (on a
    shared machine a slow moment then hits one round of every call, not all rounds of one):
    :data:`ROUNDS` rounds, past the least once :data:`BUDGET` is spent — one where a warm-up
    alone took that long (a large product varies little from run to run)."""
    began = time.perf_counter()
    for call in calls:
        call()
    least = 1 if time.perf_counter() - began > BUDGET else ROUNDS[0]
    best = [float("inf")] * len(calls)
    began = time.perf_counter()
    for r in range(ROUNDS[1]):
        if r >= least and time.perf_counter() - began > BUDGET:
            break
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def measured():
    """Every choice measured on this CPU and BLAS: ``{name: (own s, BLAS s)}`` (a name
    without the digest of its kernel's source)."""
    table = _load()
    with _lock:
        return {name.split(" #")[0]: times[:2] for name, times in table.items()}


@functools.lru_cache(maxsize=None)
def path():
    """The file of this CPU's, BLASes' and kernels' measurements — of this build of them: the
    compiler's flags are part of it (an AVX2 build, ``MINICAVS_MARCH=x86-64-v3``, compiles
    the level loop's product to other code than ``-march=native``: one build's measurement
    chose its kernel for the other, 0.86-0.89x the BLAS there)."""
    key = build.cache_key(build.cpu_signature(), blas.identity(), str(blas.mkl_identity()),
                          isa.target(), str(team_size()), SOURCE, METHOD, *build.cxx_flags())
    return os.path.join(build.cache_dir(), f"calibration-{key[:24]}.json")


def _load():
    global _table
    if _table is None:
        with _lock:
            if _table is None:
                _table = _read()
    return _table


def _read():
    try:
        with open(path()) as f:
            table = json.load(f)
        return {k: list(v) for k, v in table.items() if len(v) in (2, 3)}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # none yet, or unreadable: measured again


def _save(name, times):
    """Keep one measurement for the file. Written with the others taken since the last write,
    at most once every :data:`SAVE_EVERY` seconds and at exit (:func:`flush`): a new workload's
    first steps measure dozens of buckets in a burst, and each write reads and writes the whole
    file (25 ms a write with a thousand entries, a second over a tagger's first four steps)."""
    with _lock:
        _unsaved[name] = times
        if time.monotonic() - _saved_at >= SAVE_EVERY:
            _write()


def forget():
    """Drop every choice measured on this CPU, BLAS and build (the file of :func:`path`): each
    is measured again at its first use, by every later process and by this one where it has
    not made the choice yet — for a machine whose conditions changed since its choices were
    measured (``python -m minicavs doctor --measure-again``). Returns the file's path, or None
    where there was none; an OSError where it cannot be removed."""
    global _table
    with _lock:
        _unsaved.clear()
        _looked_here.clear()
        _table = {}
        try:
            os.remove(path())
        except FileNotFoundError:
            return None
        return path()


def flush():
    """Write the measurements not yet in the file (called at exit)."""
    with _lock:
        if _unsaved:
            _write()


def _write():
    """(Under ``_lock``.) Merge the unsaved measurements into the file as other processes left
    it, and replace it in one step (a reader sees the old file or the new one)."""
    global _saved_at
    table = _read()
    for name, times in _unsaved.items():
        table[name] = times
        if " #" in name:
            _drop_older(table, name)
    _unsaved.clear()
    _saved_at = time.monotonic()
    scratch = None
    try:
        fd, scratch = tempfile.mkstemp(prefix="calibration-", suffix=".part",
                                       dir=os.path.dirname(path()))
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(table, sort_keys=True))  # (no indent: the C encoder, 5x faster)
        os.replace(scratch, path())
    except OSError:  # a read-only cache: measured again by the next process
        if scratch is not None and os.path.exists(scratch):
            os.remove(scratch)


atexit.register(flush)  # (the measurements a burst left unwritten)
