"""The op registry: one definition per primitive, with every rule a pass asks of it.

A primitive (:class:`Op`) bundles everything minicavs knows about an operation: its forward on
NumPy or CuPy arrays, its shape and dtype rule, its VJP written *with ops* (so the same rule runs
on eager Tensors, on Symbols — a symbolic backward graph — and with ``create_graph=True``), and
the rules the passes ask, each declared beside the forward in the op's own module. A pass asks
the op, never its name; a rule an op does not declare has the safe meaning given beside its
default in :class:`Op`.

:func:`apply` is the single entry point, and the one place type promotion happens (the rules:
docs/tensors.md): the ``promotes`` arguments are brought to one dtype, scalars as constants of
it and other operands by an explicit ``astype`` op, so primitives always see operands of one
dtype. Then the call goes to the handler of the "highest" operand kind present: a Symbol turns
the call into a graph node, a Tensor runs it eagerly and records it for backward.
"""

import contextlib
import threading
from threading import get_ident
from collections import namedtuple

import numpy as np

from ..errors import DTypeError, ShapeError

Aval = namedtuple("Aval", "shape dtype")
Aval.__doc__ = "An abstract value: the shape and dtype of an array, without its data."

_SCALARS = (bool, int, float, np.number, np.bool_)


class Op:
    """A primitive operation.

    ``forward(xp, *arrays, **attrs)`` computes it (``xp``: numpy or cupy); ``infer(*avals,
    **attrs)`` gives the output's Aval from the inputs' (anything with ``.shape`` and
    ``.dtype``) and raises a clear error for inputs that do not fit; ``vjp(g, out, *inputs,
    **attrs)`` returns the gradient of each input, written with ops (None: not differentiable,
    as comparisons); ``nondiff_args``: argument positions that get no gradient. A
    ``multi_output`` op returns a tuple; its vjp gets a list of output gradients (None for an
    output no one used) and the tuple of outputs (only eager calls of whole static functions;
    traced graphs use single-output primitives).

    The class attributes below are the other rules, keyword arguments of the constructor; each
    default is the safe meaning of a rule an op does not declare.
    """

    # For elementwise ops, a C expression template (``"tanh({0})"``) from which the fusion code
    # generator writes CPU and CUDA kernels.
    c_expr = None
    # batch(op, items, attrs, out) -> batched symbol: the batching rule that runs the op on a
    # whole batching task inside a vertex function (ops/batching.py). None: the op cannot be
    # used inside a vertex function (tracing the cell raises a GraphError naming the op).
    batch = None
    # into(*arrays, out, **attrs): writes the result into the preallocated array ``out`` (an
    # elementwise op's writer is NumPy ufuncs, used on NumPy arrays only; on CuPy those ops run
    # as generated kernels); ``in_place``: ``out`` may be one of the arrays. None: the result is
    # computed by ``forward`` and copied into ``out``.
    into, in_place = None, False
    # The op overflows harmlessly in an intermediate step (sigmoid's e^-x is inf for very
    # negative x, giving the right limit 0): a caller of ``into`` silences NumPy's warning.
    quiet_overflow = False
    # commutative: op(a, b) == op(b, a) exactly, so CSE merges the two. associative:
    # op(op(a, b), c) may be computed as op(op(a, c), b) (equal up to rounding), so F may
    # regroup a sum to add its eager terms first.
    commutative = associative = False
    # zero_rows(ranges, **attrs) -> range: which output rows are known to be zero from which
    # input rows are (ops/rows.py). None: nothing known (FULL), always safe.
    zero_rows = None
    # join(terms) -> terms: for values this op made (two or more), a cheaper list of values
    # with the same sum; symbolic backward uses it to add up the gradients reaching one symbol
    # (pad_axis: zero-padded slices become one concat). None: plain addition.
    join = None
    # keeps_rows: row r of the output is row r of the first input, reshaped (both with a vertex
    # axis), so a pass may follow a value's rows through the op. assembles_in_place: the output
    # is the inputs side by side along attrs["axis"], so each input may be written straight
    # into its part of the output's buffer (concat).
    keeps_rows = assembles_in_place = False
    # The position of an argument of row indices: row i of the output is row idx[i] of the
    # table (take_rows), or row i of the input goes to row idx[i] of the output
    # (scatter_add_rows); an index of -1 is a zero or unused row (rows.index_rows(idx)).
    row_index_arg = None
    # on_nonzero_rows(xp, node, args, range_of, within) -> (value, range) or None: the op over
    # all rows of a batch when its operands are zero outside some rows (range_of(symbol);
    # within: only these rows are needed), working on the nonzero rows only (matmul: X·W on X's
    # nonzero rows, Xᵀ·G where both are nonzero). None, or a None result: the plain forward.
    on_nonzero_rows = None
    # How the native CPU backend (minicavs/cpu) runs the op in a level loop when it is neither
    # elementwise (c_expr) nor a concat (assembles_in_place): "window" (indices start:stop of
    # input 0 along attrs["axis"], a view: slice_axis), "product" (one BLAS gemm: matmul),
    # "view" (each row seen in another shape, or repeated along size-1 axes: reshape,
    # broadcast_to), "sum" (over axes of each row), "pad" (each row zero-padded along
    # attrs["axis"]: pad_axis). None: a program whose level loop holds the op runs on the NumPy
    # interpreter.
    native = None
    # Type promotion: the argument positions brought to one dtype before the op runs (a tuple,
    # or "all" for any number of operands, as concat); the others (a mask, indices) keep
    # theirs. (): nothing is promoted and ``infer`` checks the dtypes. promotes_to_float: the
    # promoted dtype must be a float; integers and bools become the default float dtype.
    promotes, promotes_to_float = (), False
    # What messages call each argument (a vertex function's pulled input and captured
    # parameters); None: "argument i".
    argument_names = None
    # expand(*args, **attrs): the op written with other primitives. An op that fuses primitives
    # for eager code and automatic batching (one node instead of several: linear, lstm_step) is
    # expanded while tracing, so traced graphs — and the passes and backends that read them —
    # hold only primitives. None: traced as itself.
    expand = None
    # runs_whole: the op batches its own work over a whole batch (a vertex function's call on a
    # GraphBatch) and its vjp runs on values only, never traced: inside ``mc.autobatch`` it runs
    # at once, as eager code runs it, and its gradient goes through its own backward.
    runs_whole = False

    def __init__(self, name, forward, infer, vjp=None, c_expr=None, nondiff_args=(),
                 multi_output=False, **rules):
        if rules.get("in_place") and rules.get("into") is None:
            raise ValueError(f"op {name!r}: in_place needs a writer (into)")
        unknown = rules.keys() - _RULES.keys()
        if unknown:
            raise TypeError(f"op {name!r}: unknown rule(s) {sorted(unknown)}")
        # every rule an instance attribute: ops are read on the hot path, and a class attribute
        # read through an instance is slower (30 ns against 15 here, Python 3.11)
        self.__dict__.update(_RULES, **rules)
        self.name, self.forward, self.infer, self.vjp, self.c_expr = name, forward, infer, vjp, \
            c_expr
        self.nondiff_args, self.multi_output = frozenset(nondiff_args), multi_output

    def argument_name(self, i):
        names = self.argument_names
        return names[i] if names is not None and i < len(names) else f"argument {i}"

    @property
    def is_elementwise(self):
        return self.c_expr is not None

    def __repr__(self):
        return f"Op({self.name})"


_RULES = {k: v for k, v in vars(Op).items()  # the rules' defaults: the class attributes
          if not k.startswith("_") and not callable(v) and not isinstance(v, property)}
OPS = {}  # name -> Op: the registry itself


def register(op):
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is defined twice")
    OPS[op.name] = op
    return op


# --- dispatch ---------------------------------------------------------------------------------

class _Tracing(threading.local):
    """This thread's active symbolic tracers, innermost last (see autodiff/symbolic.py). While
    one is active, an op on Tensors that require grad is recorded in its graph too, so ``W.T``
    inside a traced function stays connected to ``W`` instead of becoming a frozen constant.
    One stack per thread: a trace records its own thread's ops, never another thread's eager
    code (which got a Symbol back from a trace running beside it)."""

    def __init__(self):
        self.stack = []


_tracing = _Tracing()
tracing_threads = 0  # threads tracing now: while none, eager code tests one int
_tracing_lock = threading.Lock()


def tracers():
    """This thread's active tracers, innermost last (the list itself: it stays this thread's)."""
    return _tracing.stack


@contextlib.contextmanager
def tracing(tracer):
    """``tracer`` records this thread's ops on Symbols and parameters inside the block."""
    global tracing_threads
    stack = _tracing.stack
    with _tracing_lock:
        tracing_threads += not stack
        stack.append(tracer)
    try:
        yield tracer
    finally:
        with _tracing_lock:
            stack.pop()
            tracing_threads -= not stack


_default_handler = None  # set by minicavs.autodiff.tensor: plain arrays run eagerly as Tensors


def set_default_handler(handler):
    global _default_handler
    _default_handler = handler


def is_scalar(x):
    return isinstance(x, _SCALARS)


def needs_grad(x):
    """Whether a VJP must compute the gradient of input ``x``: False only for an eager tensor
    that requires none (data), so a VJP may skip an expensive term and return None for it;
    symbolic inputs always say True (their graph drops unused terms itself)."""
    return getattr(x, "requires_grad", True) is not False


# --- type promotion ---------------------------------------------------------------------------

_KIND_ORDER = {"b": 0, "u": 1, "i": 1, "f": 2}  # bool < integer < float
_SCALAR_KIND = {bool: 0, np.bool_: 0, int: 1, float: 2}


def _scalar_kind(x):
    for kind, order in _SCALAR_KIND.items():
        if isinstance(x, kind):
            return order
    return _KIND_ORDER.get(np.dtype(type(x)).kind, 2)  # a NumPy scalar


def _default_of(kind):
    from ..backend import default_dtype

    return (np.dtype(np.bool_), np.dtype(np.int64), default_dtype())[kind]


def result_dtype(dtypes, scalars=(), to_float=False):
    """The dtype that operands of ``dtypes`` (arrays, tensors: "strong") and ``scalars``
    (Python and NumPy scalars: "weak") are computed in, by docs/tensors.md's rules 1-3:
    NumPy's between strong dtypes, but a float beats any integer or bool; a weak scalar only
    lifts the kind. ``to_float``: integers and bools become the default float dtype."""
    strong = [np.dtype(d) for d in dtypes]
    floats = [d for d in strong if d.kind == "f"]
    dtype = np.result_type(*(floats or strong)) if strong else None
    weak_kind = max((_scalar_kind(x) for x in scalars), default=-1)
    if dtype is None or weak_kind > _KIND_ORDER.get(dtype.kind, 2):
        dtype = _default_of(weak_kind) if weak_kind >= 0 else _default_of(2)
    if to_float and dtype.kind != "f":
        dtype = _default_of(2)
    return dtype


def _weak_constant(opname, position, x, dtype):
    """A scalar as a constant of ``dtype``; an integer that does not fit is an error (as in
    NumPy 2), never a silent wrap-around."""
    if dtype.kind in "iu" and not isinstance(x, (bool, np.bool_)):
        info = np.iinfo(dtype)
        if not info.min <= int(x) <= info.max:
            raise DTypeError(f"op '{opname}': argument {position} is the integer {int(x)}, out "
                             f"of range for the other operands' dtype {dtype} "
                             f"[{info.min}, {info.max}]; convert the tensor first "
                             f"(e.g. x.astype('int64'))")
    return dtype.type(x)


def promote(op, args):
    """``args`` with the operands ``op.promotes`` names brought to their common dtype."""
    positions = range(len(args)) if op.promotes == "all" else op.promotes
    if not positions:
        return args
    args = tuple(_as_array(a) if isinstance(a, (list, tuple)) else a for a in args)
    dtypes, scalars = [], []
    for i in positions:
        a = args[i]
        if is_scalar(a):
            scalars.append(a)
        else:
            dtypes.append(a.dtype)
    if not scalars and not op.promotes_to_float and all(d == dtypes[0] for d in dtypes):
        return args  # the common case: nothing to do
    dtype = result_dtype(dtypes, scalars, op.promotes_to_float)
    out = list(args)
    for i in positions:
        a = args[i]
        if is_scalar(a):
            out[i] = _weak_constant(op.name, i, a, dtype)
        elif np.dtype(a.dtype) != dtype:
            if getattr(type(a), "__minicavs_priority__", None) is None:  # a NumPy/CuPy array
                out[i] = a.astype(dtype)  # plain data stays plain data
            else:
                out[i] = apply(OPS["astype"], a, dtype=dtype)
    return tuple(out)


def _as_array(values):
    """A list operand as ``mc.tensor`` reads it: floats in the default dtype."""
    array = np.asarray(values)
    return array.astype(_default_of(2)) if array.dtype.kind == "f" else array


class _Recording(threading.local):
    """A front-end that records ops instead of running them (``minicavs/autobatch``) does so
    for the thread that opened it, as grad mode and PyTorch's autograd state are per thread:
    eager code in another thread runs eagerly. Per thread, ``scope`` is the recording scope,
    ``recorder(op, args, attrs)`` takes the ops on Tensors (``Tensor.__minicavs_apply__``),
    and ``fast_path(op, args, attrs)`` may take a call before promotion: it returns the
    recorded result, or None to let the call go the usual way (it answers only calls whose
    operands it has seen in this form before and that promotion left unchanged then, so
    skipping promotion changes nothing)."""

    scope = recorder = fast_path = None


recording = _Recording()
recording_threads = 0  # threads with a recording scope: while none, eager code tests one int
_recording_lock = threading.Lock()
# (thread id, its fast path) while one thread records, else (None, None): :func:`apply` reads
# it instead of the thread-local (a thread-local's attribute costs ~350 instructions, a tenth
# of a recorded call). Each thread writes only its own entry, which equals its thread-local's.
_solo = (None, None)


def start_recording(scope, recorder, fast_path):
    """This thread's ops go to ``scope`` (see :class:`_Recording`) until :func:`stop_recording`."""
    global recording_threads, _solo
    with _recording_lock:
        recording.scope, recording.recorder, recording.fast_path = scope, recorder, fast_path
        recording_threads += 1
        _solo = (get_ident(), fast_path) if recording_threads == 1 else (None, None)


def stop_recording():
    global recording_threads, _solo
    with _recording_lock:
        recording.scope = recording.recorder = recording.fast_path = None
        recording_threads -= 1
        _solo = (None, None)


def set_fast_path(fast_path):
    """This recording thread's fast path is now ``fast_path`` (None: every call goes the usual
    way, as while a recorded op runs eagerly)."""
    global _solo
    recording.fast_path = fast_path
    if _solo[0] == get_ident():
        _solo = (_solo[0], fast_path)


def grad_mode_changed(enabled):
    """This thread's grad mode is now ``enabled`` (``autodiff.no_grad`` and the like): its
    recording scope, which keys the calls it records by it, is told (its C recorder reads it
    from there, not from the thread-local at every call)."""
    if recording_threads:
        scope = recording.scope
        if scope is not None:
            scope.grad_mode_changed(enabled)


def apply(op, *args, **attrs):
    """Apply primitive ``op`` to ``args``: Tensors, Symbols, arrays or Python scalars."""
    if recording_threads:
        solo = _solo
        fast_path = solo[1] if solo[0] == get_ident() else recording.fast_path
        if fast_path is not None:
            result = fast_path(op, args, attrs)
            if result is not None:
                return result
    args = promote(op, args)
    if any(is_scalar(a) for a in args):  # a scalar where no promotion applies
        args = tuple(np.asarray(a) if is_scalar(a) else a for a in args)
    handler, priority = _default_handler, -1
    for a in args:
        p = getattr(type(a), "__minicavs_priority__", None)
        if p is not None and p > priority:
            handler, priority = type(a).__minicavs_apply__, p
    return handler(op, args, attrs)


# --- shape and dtype rules shared by many ops -------------------------------------------------

def describe(shape):
    """A shape as a person reads it: ``(3, 4)``, ``(5,)``; a task's symbolic sizes by name,
    ``(V, 4)``, ``(2V,)``, ``(E,)``."""
    from .batching import dim_text  # (batching's rules use this module)

    return "(" + ", ".join(dim_text(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def broadcast_shapes(opname, avals):
    """NumPy broadcasting of the avals' shapes; an error names the op, positions and shapes."""
    result = ()
    for i, a in enumerate(avals):
        try:
            result = np.broadcast_shapes(result, tuple(a.shape))
        except ValueError:
            first = next(j for j in range(i) if _clashes(avals[j].shape, a.shape)) if i else 0
            raise ShapeError(
                f"op '{opname}': argument {first} has shape {describe(avals[first].shape)} and "
                f"argument {i} has shape {describe(a.shape)}, which do not broadcast together"
            ) from None
    return result


def _clashes(s1, s2):
    try:
        np.broadcast_shapes(tuple(s1), tuple(s2))
        return False
    except ValueError:
        return True


def common_dtype(opname, avals, positions=None):
    """All operands must share one dtype; float32 and float64 are never mixed silently."""
    positions = range(len(avals)) if positions is None else positions
    dtype = first = None
    for i in positions:
        d = np.dtype(avals[i].dtype)
        if dtype is None:
            dtype, first = d, i
        elif d != dtype:
            raise DTypeError(
                f"op '{opname}': argument {first} has dtype {dtype} and argument {i} has dtype "
                f"{d}; convert one explicitly (e.g. x.astype('{dtype}'))"
            )
    return dtype


def require_float(opname, aval, position=0):
    if np.dtype(aval.dtype).kind != "f":
        raise DTypeError(f"op '{opname}': argument {position} must be a float array, "
                         f"got dtype {np.dtype(aval.dtype)}")


def require_int(opname, aval, position):
    if np.dtype(aval.dtype).kind not in "iu":
        raise DTypeError(f"op '{opname}': argument {position} must be an integer array of "
                         f"indices, got dtype {np.dtype(aval.dtype)}")


def normalize_axis(opname, axis, ndim, position=0, zero_d=False):
    """``axis`` as a non-negative int, or a ShapeError. ``zero_d``: a 0-d argument takes axis 0
    or -1, as if it were a vector of one element (NumPy's reductions and squeeze, PyTorch's
    ops along a dim); the caller then treats it so, and 0 is returned."""
    bound = max(ndim, 1) if zero_d else ndim
    if not -bound <= axis < bound:
        takes = " (a 0-d argument takes axis 0 or -1)" if zero_d and not ndim else ""
        raise ShapeError(f"op '{opname}': axis {axis} is out of range for argument {position} "
                         f"with {ndim} dimension(s){takes}")
    return axis % bound


def normalize_axes(opname, axis, ndim):
    """None -> all axes; int or sequence -> sorted tuple of non-negative axes. A 0-d argument
    takes axis 0 or -1 (as NumPy's reductions and PyTorch do) and has nothing to reduce: ()."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = tuple(sorted({normalize_axis(opname, int(a), ndim, zero_d=True) for a in axes}))
    if len(out) != len(axes):
        raise ShapeError(f"op '{opname}': repeated axis in {axis}")
    return out if ndim else ()
