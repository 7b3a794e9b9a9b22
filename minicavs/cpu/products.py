"""Large products of a call of native loops on the library's own team of threads, and
products with an operand that stays the same on panels packed once — each where measured faster
here than NumPy's BLAS (``cpu/calibrate.py``).

Inside :func:`team_products` (the runtime opens it around a call whose level loops are all
native, and autobatch around its batches) a product large enough runs on the team: a one-thread
gemm of NumPy's BLAS per thread, each on a block of the result (``team_gemm`` in
``kernel_source.py``). Inside :func:`invariant_operands` a product with few rows whose right
operand is a step's parameter reads that parameter packed once into panels (``packed_gemm``:
a register block per instruction set, ``cpu/isa.py``), where the BLAS packs it again at every
call.
"""

import contextlib
import ctypes
import threading

import numpy as np

from . import blas, build, calibrate, isa, kernels
from .kernels import SUFFIX
from .team import set_blas_threads, state as _team, team_size


@contextlib.contextmanager
def team_products(on=True):
    """Inside this block (on a thread), large NumPy products run on the native team
    (:func:`matmul`); the runtime opens it around a call whose level loops are all native, so
    the whole call uses one pool of threads. Elsewhere NumPy's BLAS runs them: work that mixes
    the two pools (an interpreted loop's products between the team's) measured slower than
    either (RNTN: 183 -> 240 ms per 8 batches)."""
    before = getattr(_team, "on", False), getattr(_team, "threads", None), \
        getattr(_team, "kernels", None)
    # (the outermost block reads MINICAVS_KERNELS once, for all of it; a bad value raises
    # here, before anything is changed)
    kernels_choice = (calibrate.read_forced(),) if before[2] is None else before[2]
    _team.on, _team.kernels = on, kernels_choice
    if not before[0]:
        _fresh_choices()
        _team.threads = calibrate.free_cores_for_a_call() if on else None  # (once a call)
    # NumPy's own products in the block (those too small for the team) run on one BLAS
    # thread: a product on OpenBLAS's pool leaves its threads spinning, and the team's next
    # product then shares the cores with them (measured: recursive Tree-LSTM 128, 2 threads,
    # the same team products 1.6-1.8x slower after the leaf kind's small NumPy products).
    threads = set_blas_threads(1) if on and not before[0] else None
    try:
        yield
    finally:
        _team.on, _team.threads, _team.kernels = before
        if threads is not None:
            set_blas_threads(threads)


def matmul(a, b, out=None):
    """``a @ b`` for 2-D float32/float64 NumPy matrices (each row-contiguous or a transpose of
    one), inside :func:`team_products`: with ``b`` an operand of :func:`invariant_operands`, on
    its packed panels (:func:`packed_matmul`); else on a team of threads (:func:`team_size`),
    each running a one-thread gemm of NumPy's BLAS; into ``out`` (C-contiguous) when given —
    each only where measured faster here than NumPy's call (``cpu/calibrate.py``). None
    where it does not apply or is slower (NumPy runs): another BLAS, one core. Every large
    product of a step comes here, not only some: switching between OpenBLAS's threads and the
    team's costs more than either (measured: with the Xᵀ·G products left to OpenBLAS the step
    was 12 % slower). Outside the block, :func:`large_on_the_team`.

    A step asks this for every product, most of them small and left to NumPy (the tagger with
    characters: about 750 a step, 300 declined): the team's verdict on a layout of operands is
    looked up, not worked out again (asking cost 12 us, a product of 4 x 64 x 256 takes 4);
    in an :func:`invariant_operands` block a product's whole route — b's panels, the team,
    NumPy — is one look-up by b's address and both layouts (asking then cost 2.5-4 us,
    now about 1)."""
    if not getattr(_team, "on", False):
        return large_on_the_team(a, b, out)
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a.ndim != 2 or b.ndim != 2:
        return None  # (the panels and the team take matrices)
    routes = getattr(_invariant, "routes", None)
    if routes is None:
        route = _route(a, b)
    else:  # (b's address names it in the block: the block holds its weights alive. a's rows
        # as both verdicts are keyed, rows_key: a batch's row count varies step by step)
        m = len(a)
        key = (kernels.data_address(b), rows_key(m), a.shape[1], a.strides[1],
               b.shape, b.strides, a.dtype, b.dtype, _team.threads)
        route = routes.get(key)
        if route is None:
            route = routes[key] = _route(a, b)
    if route is _NUMPY:
        return None
    if route is not _TEAM:  # b's panels
        done = route.run(a, out)
        if done is not None or not _layout_wins(a, b):  # (None: the out does not fit them)
            return done
    return team_matmul(a, b, out, measured=False)


_NUMPY, _TEAM = "numpy", "team"  # the routes of a product beside a matrix's panels


def _route(a, b):
    """Where ``a @ b`` runs in this block: on ``b``'s panels (its :class:`_Panels`) where b is
    an invariant operand and they were measured faster for a's rows; else on the team
    (:data:`_TEAM`) or by NumPy (:data:`_NUMPY`), as measured for its layout."""
    arrays = getattr(_invariant, "arrays", None)
    if arrays and (kernels.data_address(b), b.size) in arrays:  # b is a weight, or its view
        panels = _applicable_panels(a, b)
        if panels and panels.faster(len(a)):
            return panels
    return _TEAM if _layout_wins(a, b) else _NUMPY


def _layout_wins(a, b):
    """Whether the team runs ``a @ b`` (:func:`_team_wins`), kept per layout of operands."""
    key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, _team.threads)
    wins = _layouts.get(key)
    if wins is None:
        if len(_layouts) > LAYOUTS:
            _layouts.clear()
        wins = _layouts[key] = _team_wins(a, b)
    return wins


_layouts = {}  # (a's and b's shape, strides and dtype, team) -> whether the team runs a @ b
LAYOUTS = 1 << 14  # (a bound: a workload of ever new shapes forgets and decides again)


# Outside a call, a product from this many multiply-adds may run on the team (below, a team's
# wake-up would be a large part of it: measuring them is not worth it).
LARGE = 1 << 24


def large_on_the_team(a, b, out=None):
    """Outside :func:`team_products` (the user's own ops: a softmax layer over all tokens, its
    gradients), ``a @ b`` of at least :data:`LARGE` multiply-adds on a team of the free cores,
    where measured faster than NumPy's BLAS on its own threads (per bucket of shapes), else
    None. With MKL's gemm it is (the Var-LSTM's softmax layer, 1456 x 256 x 10000 and its
    gradients: 202-219 GF/s against OpenBLAS's 163-189 on 2 threads; the Var-LSTM epoch
    1.59-2.01 s -> 1.34-1.59 s with every product of the step on the team)."""
    shape = getattr(a, "shape", ())
    if len(shape) != 2 or getattr(b, "ndim", 0) != 2 or \
            shape[0] * shape[1] * b.shape[1] < LARGE or build.unavailable() is not None:
        return None
    threads = calibrate.free_cores()
    if threads < 2:
        return None
    dtype = a.dtype
    suffix = SUFFIX.get(dtype)
    if suffix is None or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return None
    (m, k), n = shape, b.shape[1]
    key = ("large", suffix, _transposed(a), _transposed(b), bucket(m), bucket(n), bucket(k),
           threads)
    _fresh_choices()
    wins = _wins.get(key)
    if wins is None:
        name = _bucket_name("large", key, "BLAS's own")
        scratch = np.empty((m, n), dtype)
        wins = _wins[key] = calibrate.own_is_faster(
            name, lambda: (lambda: team_matmul(a, b, scratch, False, threads),
                           lambda: np.matmul(a, b)), threads, apart=True)
    return team_matmul(a, b, out, False, threads) if wins else None


def team_matmul(a, b, out=None, measured=True, threads=None):
    """``a @ b`` on the team (see :func:`matmul`), or None; ``measured=False`` runs it
    wherever it applies (the calibration's own side), on ``threads`` where given."""
    threads = threads or team_size()
    if not _team_applies(a, b, out, threads) or measured and not _team_wins(a, b):
        return None
    a, b = blas.operand(a)[2], blas.operand(b)[2]
    (m, k), n = a.shape, b.shape[1]
    if out is None:
        out = np.empty((m, n), dtype=a.dtype)
    split_k = k > max(m, n) and _split_k(a, b, threads)
    _team_gemm(a, b, out, threads, np.empty((threads - 1, m, n), a.dtype) if split_k else None)
    return out


def _team_applies(a, b, out, threads):
    """Whether the team can run ``a @ b`` (into ``out``) on ``threads``."""
    dtype = getattr(a, "dtype", None)
    if SUFFIX.get(dtype) is None or getattr(b, "dtype", None) != dtype or a.ndim != 2 \
            or b.ndim != 2 or a.shape[1] != b.shape[0] or not isinstance(a, np.ndarray) \
            or not isinstance(b, np.ndarray) or a.size == 0 or b.size == 0:
        return False
    if out is not None and (out.dtype != dtype or out.shape != (a.shape[0], b.shape[1])
                            or not out.flags.c_contiguous):
        return False
    return threads >= 2 and calibrate.gemm(dtype)[1] in ("cblas64", "cblas32") \
        and kernels.library() is not None


def _team_wins(a, b):
    """Whether the team runs ``a @ b`` inside :func:`team_products`: it applies and was measured
    faster here than NumPy's call, per layout and width of the out, a's rows as
    :func:`rows_key` keys them, the inner size by bucket (a batch's rows in Xᵀ·G and a bias's
    ones·G: a new count every step). Keyed by a bucket of the width too, a verdict measured
    at one shape ran others where NumPy's BLAS works another way: OpenBLAS on one thread takes
    13 us for 4 x 256 x 640 and 114 us for 4 x 256 x 1024 (its small-matrix kernel, then its
    packing one), so the team, measured against the second, ran the first at 0.5x the BLAS."""
    threads = team_size()
    if not getattr(_team, "on", False) or not _team_applies(a, b, None, threads):
        return False
    (ta, _, a), (tb, _, b) = blas.operand(a), blas.operand(b)
    (m, k), n = a.shape, b.shape[1]
    key = ("team", SUFFIX[a.dtype], ta, tb, rows_key(m), n, bucket(k), threads)
    wins = _wins.get(key)
    if wins is None:
        name = (f"team {key[1]} {rows_text(key[4])}x{n}x<={1 << key[6]}"
                f"{' Aᵀ' if ta else ''}{' Bᵀ' if tb else ''} ({threads} threads)")
        scratch = np.empty((m, n), a.dtype)
        wins = _wins[key] = calibrate.own_is_faster(
            name, lambda: (lambda: team_matmul(a, b, scratch, False),
                           lambda: np.matmul(a, b)), threads, against_one=True)
    return wins


def _team_gemm(a, b, out, threads, partial=None):
    """``out = a @ b`` by ``team_gemm`` (kernel_source.py) on ``threads``: ``a`` and ``b`` as
    :func:`~.blas.operand` gives them; the inner dimension split where a ``partial`` scratch
    ((threads - 1) x m x n) is given, else the out's longer side."""
    address, interface, _ = calibrate.gemm(a.dtype)
    (ta, lda, a), (tb, ldb, b) = blas.operand(a), blas.operand(b)
    (m, k), n = a.shape, b.shape[1]
    integer = ctypes.c_int64 if interface == "cblas64" else ctypes.c_int
    getattr(kernels.library(), f"team_gemm_{SUFFIX[a.dtype]}_{interface[-2:]}")(
        ctypes.c_void_p(address), ctypes.c_void_p(blas.threads_local()), ctypes.c_int(ta),
        ctypes.c_int(tb), integer(m), integer(n), integer(k), kernels.pointer(a), integer(lda),
        kernels.pointer(b), integer(ldb), kernels.pointer(out), integer(n),
        ctypes.c_int(threads), ctypes.c_void_p(None if partial is None else partial.ctypes.data))


def _split_k(a, b, threads):
    """Whether the team splits the inner dimension of ``a @ b``, whose k is its longest side
    (``team_gemm`` in kernel_source.py), measured per bucket against its split of the out:
    (256 x 16384ᵀ) x (16384 x 256), one thread's half: 52 GF/s split by k against 37 by rows
    of the out. ``MINICAVS_KERNELS=own`` splits k wherever it applies (the tests), ``blas``
    never (the out's split, as before)."""
    (m, k), n = a.shape, b.shape[1]
    key = ("k", SUFFIX[a.dtype], _transposed(a), _transposed(b), bucket(m), bucket(n),
           bucket(k), threads)
    wins = _wins.get(key)
    if wins is None:
        out, partial = np.empty((m, n), a.dtype), np.empty((threads - 1, m, n), a.dtype)
        wins = _wins[key] = calibrate.own_is_faster(
            _bucket_name("team k-split", key, "against the out's split"),
            lambda: (lambda: _team_gemm(a, b, out, threads, partial),
                     lambda: _team_gemm(a, b, out, threads)), threads)
    return wins


def _transposed(x):
    """1 where a matrix is read as the transpose of a row-major one (its columns contiguous)."""
    return int(x.strides[1] != x.itemsize)


def _bucket_name(kind, key, versus=None):
    """A bucket's name in the calibration's file (and doctor's list)."""
    _, suffix, ta, tb, *sizes, threads = key
    return (f"{kind} {suffix} {'x'.join(f'<={1 << e}' for e in sizes)}"
            f"{' Aᵀ' if ta else ''}{' Bᵀ' if tb else ''} ({threads} threads"
            f"{', ' + versus if versus else ''})")


_wins = {}  # bucket -> whether the library's kernel runs it (calibrate.py), for the state:
_wins_forced = [None]  # MINICAVS_KERNELS when they were chosen


def _fresh_choices():
    """At a block's start: choices made before a change of ``MINICAVS_KERNELS`` are dropped."""
    force = calibrate.forced()
    if force != _wins_forced[0]:
        _wins.clear()
        _layouts.clear()
        _wins_forced[0] = force


def bucket(size):
    """The power of two at or above ``size``, as an exponent: shapes measured together."""
    return (size - 1).bit_length()


# A's rows up to which a product's verdict is kept per row count, not per power of two: there
# OpenBLAS's small-matrix kernels make adjacent counts differ by 2-10x, not monotonically (one
# thread: 128 x 1024 at 3 rows 29 us, at 4 rows 11; 256 x 1024 at 3 rows 58 us, at 4 rows 135),
# so a verdict measured at a bucket's top ran its other counts on the slower side.
EXACT_ROWS = 16


def rows_key(m):
    """A's row count in a verdict's key: itself up to :data:`EXACT_ROWS`, else its bucket
    (negative)."""
    return m if m <= EXACT_ROWS else -bucket(m)


def rows_text(key):
    """A :func:`rows_key` as a bucket's name writes it: ``3``, ``<=32``."""
    return str(key) if key >= 0 else f"<={1 << -key}"


# --- products with an operand that stays the same (packed_gemm in the source above) ------------

_invariant = threading.local()


@contextlib.contextmanager
def invariant_operands(arrays):
    """Inside this block (on a thread) the NumPy matrices ``arrays`` — a step's parameters —
    do not change: a product with few rows whose right operand is one of them, or its
    transpose (``G · Wᵀ`` backward), runs on a copy of it packed once into panels
    (:func:`packed_matmul`), not packed again by the BLAS at every call. The block holds the
    arrays, so no other array can take their memory while their packings are cached. Nested:
    the inner block adds its arrays and its own packings."""
    before = getattr(_invariant, "arrays", None), getattr(_invariant, "packs", None)
    known = dict(before[0] or {})
    for a in arrays:
        if isinstance(a, np.ndarray) and a.ndim == 2 and a.dtype in SUFFIX and (
                a.flags.c_contiguous or a.flags.f_contiguous):
            known[(kernels.data_address(a), a.size)] = a
    before += (getattr(_invariant, "routes", None),)
    _invariant.arrays, _invariant.packs, _invariant.routes = known, {}, {}
    _fresh_choices()
    try:
        yield
    finally:
        _invariant.arrays, _invariant.packs, _invariant.routes = before


def packed_matmul(a, b, out=None, measured=True):
    """``a @ b`` inside :func:`invariant_operands` with ``b`` (or ``b.T``) one of its arrays,
    from ``b``'s panels (packed on first use in the block) where they are measured faster here
    than what runs otherwise (``cpu/calibrate.py``: per row count as :func:`rows_key` keys
    it); None where it does not apply or is slower. ``measured=False``: wherever it applies."""
    panels = _applicable_panels(a, b)
    if not panels or measured and not panels.faster(len(a)):
        return None
    return panels.run(a, out)


def _applicable_panels(a, b):
    """``b``'s panels in this block where ``a @ b`` can run on them, else None."""
    packs = getattr(_invariant, "packs", None)
    if packs is None or type(a) is not np.ndarray or type(b) is not np.ndarray or a.ndim != 2 \
            or b.ndim != 2:
        return None
    key = (kernels.data_address(b), b.shape, b.strides, b.dtype)
    panels = packs.get(key)
    if panels is None:
        panels = packs[key] = _Panels.of(b)
    if not panels or a.dtype != b.dtype or a.shape[1] != b.shape[0] or len(a) == 0:
        return None
    return panels


class _Panels:
    """One invariant ``b``'s panels in a block, packed when first used."""

    def __init__(self, lib, b, transposed, prefix, suffix):
        self.lib, self.b, self.transposed, self.suffix = lib, b, transposed, suffix
        self.prefix = prefix  # (in a team's block its size, sampled once; else cores free now)
        self.threads = team_size() if getattr(_team, "on", False) else calibrate.free_cores()
        self.gemm = kernels.typed(lib, f"{prefix}_packed_gemm_{suffix}", _PACKED_GEMM_ARGS)
        self.key = ("panels", prefix, suffix, transposed, b.shape, self.threads)
        self._packed = None

    @classmethod
    def of(cls, b):
        """The panels of ``b``, or False where products with it do not run on panels: not an
        invariant operand, a layout other than one of a matrix and its transpose, no native
        code, a forked child."""
        (k, n), item = b.shape, b.itemsize
        if b.dtype not in SUFFIX or (kernels.data_address(b), b.size) not in _invariant.arrays \
                or build.forked_child() or b.size == 0:
            return False
        if b.strides == (n * item, item):
            transposed = 0
        elif b.strides == (item, k * item):
            transposed = 1
        else:
            return False
        lib = kernels.library()
        if lib is None:
            return False
        return cls(lib, b, transposed, isa.target(), SUFFIX[b.dtype])

    def packed(self):
        if self._packed is None:
            self._packed = pack_panels(self.b, threads=self.threads)
        return self._packed

    def run(self, a, out=None):
        """``a @ b`` on the panels, into ``out`` where given (None where ``out`` does not fit)."""
        (m, k), n, item = a.shape, self.b.shape[1], self.b.itemsize
        if out is not None and (out.dtype != a.dtype or out.shape != (m, n)
                                or not out.flags.c_contiguous):
            return None
        if a.strides[1] != item or a.strides[0] < k * item or a.strides[0] % item:
            a = np.ascontiguousarray(a)
        if out is None:
            out = np.empty((m, n), dtype=a.dtype)
        self.gemm(kernels.data_address(a), a.strides[0] // item,
                  kernels.data_address(self.packed()), m, n, k, kernels.data_address(out), n,
                  self.threads)
        return out

    def faster(self, m):
        # (keyed by rows_key, as measured: a few rows by their count, where the BLAS's time
        # jumps between counts; more by bucket, as a batch's row counts vary step by step)
        key = self.key + (rows_key(m),)
        wins = _wins.get(key)
        if wins is None:
            (k, n), b = self.b.shape, self.b
            rows = key[-1] if key[-1] >= 0 else 1 << -key[-1]
            name = (f"panels {self.suffix} {rows_text(key[-1])}x{k}x{n}"
                    f"{' Bᵀ' if self.transposed else ''} "
                    f"({self.prefix}, {self.threads} threads)")

            def make():
                x = np.random.default_rng(0).standard_normal((rows, k)).astype(b.dtype)
                return lambda: packed_matmul(x, b, measured=False), _otherwise(x, b)
            wins = _wins[key] = calibrate.own_is_faster(name, make, self.threads)
        return wins


def pack_panels(w, out=None, threads=1):
    """The panels of a weight ``w`` (k x m, read as :func:`blas.operand` reads it: row-major
    or the transpose of a row-major matrix) as this CPU's panel kernel reads them, into
    ``out`` where it is large enough: for :class:`_Panels` and the native level loops'
    products (``runtime/native.py``)."""
    transposed, ld, w = blas.operand(w)
    k, m = w.shape
    width = panel_width(w.dtype)
    size = -(-m // width) * width * k
    if out is None or len(out) < size:
        out = np.empty(size, dtype=w.dtype)
    getattr(kernels.library(), f"{isa.target()}_pack_panels_{SUFFIX[w.dtype]}")(
        kernels.pointer(w), ctypes.c_int64(ld), ctypes.c_int(transposed), ctypes.c_int64(k),
        ctypes.c_int64(m), kernels.pointer(out), ctypes.c_int(threads))
    return out


def panel_width(dtype):
    """The columns of a panel of this CPU's panel kernel (its target's vector block)."""
    return getattr(kernels.library(), f"{isa.target()}_panel_width_{SUFFIX[np.dtype(dtype)]}")()


def panel_kernel(dtype):
    """This CPU's ``packed_panels`` for ``dtype`` (a range of panels on the calling thread,
    writing or adding), its arguments declared, or None (no native kernels)."""
    lib = kernels.library()
    if lib is None or np.dtype(dtype) not in SUFFIX:
        return None
    return kernels.typed(lib, f"{isa.target()}_packed_panels_{SUFFIX[np.dtype(dtype)]}",
                         _PANELS_ARGS)


def panels_call(x, packed, out):
    """A call of the panel kernel over all panels on the calling thread (a team member's
    share) of ``out = x . w``, ``w`` packed by :func:`pack_panels` — the level loop's product
    as it is measured (``runtime/native.py``, ``benchmarks/kernels.py``). Rows of ``x`` and
    ``out`` packed (C order)."""
    (rows, k), m, item = x.shape, out.shape[1], x.itemsize
    kernel = panel_kernel(x.dtype)
    args = (x.ctypes.data, x.strides[0] // item, packed.ctypes.data, rows, m, k,
            out.ctypes.data, out.strides[0] // item, 0, len(packed) // (k * panel_width(x.dtype)),
            0)
    return lambda keep=(x, packed, out): kernel(*args)  # (the arrays live as long as the call)


_PANELS_ARGS = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                ctypes.c_int)


def _otherwise(a, b):
    """What runs ``a @ b`` in a team block where the panels do not, as a call (the team's
    choice made first: only the product itself is timed)."""
    if team_matmul(a, b) is not None:
        return lambda: team_matmul(a, b, measured=False)
    return lambda: a @ b


# (pointers as ints, sizes as int64, the team as int: declared, ctypes converts plain ints in C)
_PACKED_GEMM_ARGS = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                     ctypes.c_int)


def team_ready():
    """Whether large products can run on the native team in this process: native code on,
    more than one core, and NumPy's BLAS callable one thread a call (CBLAS)."""
    if build.unavailable() is not None or team_size() < 2:
        return False
    return blas.gemm("float32")[1] in ("cblas64", "cblas32")
