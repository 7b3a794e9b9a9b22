"""The C source of a fused elementwise group: the one body every native backend compiles.

:func:`elementwise_source` turns a fused group (``runtime/analysis.FusedGroup``: linked
elementwise nodes, each op with a C expression ``op.c_expr``, e.g. ``"tanh({0})"``, ``{T}`` = the
C type of the result) into the texts of a ``cupy.ElementwiseKernel`` (``cuda/fusion.py``), which
the native CPU loops run too (``cpu/fused.py``, ``runtime/codegen.py``):

* ``in_params``  the group inputs, ``"T x0, T x1, bool x2"``: ``T`` for values in the compute
  dtype, the NumPy type name otherwise (broadcasting the inputs is the caller's);
* ``out_params`` the group outputs, ``"T y0, T y1"``;
* ``operation``  one C statement per member, each into a local ``t<j>`` (no value is read back
  from memory), then one assignment per output: ::

      const T t0 = (1 / (1 + exp(-x0)));  // sigmoid
      const T t1 = tanh(x1);  // tanh
      const T t2 = (t0 * t1);  // mul
      y0 = t2;

It is named ``minicavs_fused_<hash>`` (of its dtype and texts) and made once per (group
signature, dtype), so equal groups (the T copies of an unrolled cell) share it. A group is read
through ``members``/``inputs``/``outputs`` and each member's ``op``, ``attrs``, ``inputs``,
``dtype``: this module stands on the ground floor, beside ``errors.py``.
"""

import hashlib
import math
from collections import namedtuple

import numpy as np

from .errors import KernelCompileError

# NumPy dtype -> C type, for the dtypes a fused body may hold (the compute dtype is float32 or
# float64; masks are bool; integer members come only from an explicit astype).
C_TYPES = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "signed char", np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int16): "short", np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int32): "int", np.dtype(np.uint32): "unsigned int",
    np.dtype(np.int64): "long long", np.dtype(np.uint64): "unsigned long long",
}
COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def numbered(source):
    """``source`` with 1-based line numbers, the form compiler logs refer to."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{n:>{width}} | {line}" for n, line in enumerate(lines, 1))


class ElementwiseSource(namedtuple("ElementwiseSource", "name dtype in_params out_params "
                                                      "operation preamble inputs outputs ops")):
    """A fused group as ElementwiseKernel texts (see the module docstring).

    ``name``: ``minicavs_fused_<hash>``; ``dtype``: the compute dtype's name; ``in_params``,
    ``out_params``, ``operation``, ``preamble``: the arguments of ``cupy.ElementwiseKernel``;
    ``inputs``/``outputs``: ``((dtype name, C type, param name), ...)`` in group order; ``ops``:
    the member op names, in order."""

    __slots__ = ()

    def describe(self):
        return f"fused kernel '{self.name}' ({self.dtype}; ops: {' '.join(self.ops)})"


def compute_dtype(group, values=None):
    """The float dtype the group computes in: that of its float inputs (``values``: the arrays
    bound to them; by default the traced inputs; all share one, the ops check that), else that of
    its first float member (a group fed by integer data only), else that of its first output."""
    for x in group.inputs if values is None else values:
        if x.dtype.kind == "f":
            return x.dtype
    for m in group.members:
        if m.dtype.kind == "f":
            return m.dtype
    return group.outputs[0].dtype


def run_dtypes(group, dtype):
    """dtypes of the inputs and members when the group computes in ``dtype``: values of the
    traced float dtype follow ``dtype``; masks and explicit casts keep theirs."""
    traced = compute_dtype(group)

    def run(x):
        return dtype if x.dtype == traced else x.dtype

    return [run(x) for x in group.inputs], [run(m) for m in group.members]


class _CLiteral:
    """An attribute value that formats (``{exponent!r}``) as a C literal."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        v = self.value
        if isinstance(v, (bool, np.bool_)):
            return "true" if v else "false"
        if isinstance(v, (int, np.integer)):
            return f"{int(v)}LL"
        if isinstance(v, (float, np.floating)):
            v = float(v)
            if math.isnan(v):
                return "(0.0 / 0.0)"
            if math.isinf(v):
                return "(1.0 / 0.0)" if v > 0 else "(-1.0 / 0.0)"
            return repr(v)  # always has '.', 'e' or is exact: a valid C double literal
        return repr(v)

    def __format__(self, spec):
        return format(self.value, spec)


def elementwise_source(group, dtype):
    """The :class:`ElementwiseSource` of ``group`` computing in ``dtype`` (float32 or float64),
    cached by (group signature, dtype)."""
    dtype = np.dtype(dtype)
    key = (group.signature(), dtype.str)
    source = _SOURCES.get(key)
    if source is None:
        source = _SOURCES[key] = _generate(group, dtype)
    return source


_SOURCES = {}  # (group signature, dtype) -> ElementwiseSource


def _generate(group, dtype):
    if dtype not in COMPUTE_DTYPES:
        raise KernelCompileError(f"fusion: no fused kernels for dtype {dtype} (float32 and "
                                 f"float64 only)")
    input_dtypes, member_dtypes = run_dtypes(group, dtype)
    for d in input_dtypes + member_dtypes:
        if d not in C_TYPES:
            raise KernelCompileError(f"fusion: a member or input has dtype {d}, which fused "
                                     f"kernels do not support")

    def label(d):  # a parameter's type in CuPy's signature
        return "T" if d == dtype else d.name

    def ctype(d):  # a value's type in the body
        return "T" if d == dtype else C_TYPES[d]

    inputs = tuple((d.name, C_TYPES[d], f"x{k}") for k, d in enumerate(input_dtypes))
    name_of = {x.key: f"x{k}" for k, x in enumerate(group.inputs)}
    lines = []
    for j, (m, d) in enumerate(zip(group.members, member_dtypes)):
        if m.op.c_expr is None:
            raise KernelCompileError(f"fusion: member {j} ({m.op.name}) has no C expression")
        attrs = {k: _CLiteral(v) for k, v in m.attrs.items()}
        try:
            expr = m.op.c_expr.format(*[name_of[x.key] for x in m.inputs], T=ctype(d), **attrs)
        except (IndexError, KeyError) as exc:
            raise KernelCompileError(f"fusion: the C expression {m.op.c_expr!r} of op "
                                     f"'{m.op.name}' needs {exc}, which member {j} does not "
                                     f"have") from None
        lines.append(f"const {ctype(d)} t{j} = {expr};  // {m.op.name}")
        name_of[m.key] = f"t{j}"
    position = {m.key: j for j, m in enumerate(group.members)}
    outputs = []
    for p, o in enumerate(group.outputs):
        d = member_dtypes[position[o.key]]
        outputs.append((d.name, C_TYPES[d], f"y{p}"))
        lines.append(f"y{p} = {name_of[o.key]};")
    outputs = tuple(outputs)
    in_params = ", ".join(f"{label(np.dtype(d))} {n}" for d, _, n in inputs)
    out_params = ", ".join(f"{label(np.dtype(d))} {n}" for d, _, n in outputs)
    operation = "\n".join(lines)
    # CuPy typedefs T only when a parameter is typed T; the body may use T all the same.
    uses_t = any(np.dtype(d) == dtype for d, _, _ in inputs + outputs)
    preamble = "" if uses_t else f"typedef {C_TYPES[dtype]} T;"
    digest = hashlib.sha1("\0".join((dtype.str, in_params, out_params, operation, preamble))
                          .encode()).hexdigest()[:12]
    return ElementwiseSource(f"minicavs_fused_{digest}", dtype.name, in_params, out_params,
                             operation, preamble, inputs, outputs,
                             tuple(m.op.name for m in group.members))
