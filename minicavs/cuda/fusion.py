"""Fusion code generation: one ``cupy.ElementwiseKernel`` per fused group (Cavs §3.4).

A :class:`~minicavs.runtime.analysis.FusedGroup` is a set of linked elementwise nodes; each op
brings a C expression (``op.c_expr``, e.g. ``"tanh({0})"``, ``{T}`` = the C type of the result).
:func:`elementwise_source` turns a group into the three texts an ElementwiseKernel is made of:

* ``in_params``  the group inputs, ``"T x0, T x1, bool x2"``: ``T`` for values in the compute
  dtype, the NumPy type name otherwise. Broadcasting (an ``(H,)`` bias against ``(N, H)`` rows,
  the 0-d constant 1 of ``1 - h*h``) is CuPy's elementwise broadcasting of the inputs;
* ``out_params`` the group outputs, ``"T y0, T y1"``;
* ``operation``  one C statement per member, each into a local ``t<j>`` (so no value is read
  back from global memory), then one assignment per output: ::

      const T t0 = (1 / (1 + exp(-x0)));  // sigmoid
      const T t1 = tanh(x1);  // tanh
      const T t2 = (t0 * t1);  // mul
      y0 = t2;

The kernel is named ``minicavs_fused_<hash>``, the hash of its dtype and texts, and built once per
(group signature, dtype): every group with the same signature (the T copies of an unrolled cell,
the two ``1 - h*h`` of ∂F) shares it. :class:`CupyFusedKernel` is the executor's
:class:`~minicavs.runtime.executor.FusedKernel` for CuPy arrays; the executor imports it on first
use (``import minicavs`` never imports CuPy). A body that does not compile raises
:class:`~minicavs.errors.KernelCompileError` with the generated source, numbered, and the ops.

Checked without a GPU: :meth:`ElementwiseSource.raw_source` wraps the same ``operation`` into a
grid-stride RawKernel (``shim.elementwise_raw_source``, one thread per element i) that NVRTC
compiles for compute_90 and the g++ shim runs on the CPU; :class:`ShimFusedKernel` is the
CuPy kernel's CPU twin (same call logic, inputs broadcast on the host, body run by the shim).
Both sides compile without contraction (``nvrtc.KERNEL_OPTIONS``), and the shim runs float32
bodies with subnormals flushed, as CuPy's ``-ftz=true`` makes the GPU do. The C expressions
follow NumPy's NaN rules (``ops/elementwise.py``); the math functions (exp, log, tanh, pow)
are the GPU's and libm's, equal to NumPy's within a few units in the last place.

This module imports nothing from the layers above the CUDA layer: a group is read through its
``members``/``inputs``/``outputs`` and each member's ``op``, ``attrs``, ``inputs``, ``dtype``.
"""

import functools
import hashlib
import math
from collections import namedtuple

import numpy as np

from ..errors import GraphError
from .errors import KernelCompileError, numbered

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
BLOCK_SIZE = 256  # the shim's launch shape (its kernels are grid-stride loops)
MAX_BLOCKS = 4096


# --- the generated source ----------------------------------------------------------------------

class ElementwiseSource(namedtuple("ElementwiseSource", "name dtype in_params out_params "
                                                      "operation preamble inputs outputs ops")):
    """A fused group as ElementwiseKernel texts (see the module docstring).

    ``name``: ``minicavs_fused_<hash>``; ``dtype``: the compute dtype's name; ``in_params``,
    ``out_params``, ``operation``, ``preamble``: the arguments of ``cupy.ElementwiseKernel``;
    ``inputs``/``outputs``: ``((dtype name, C type, param name), ...)`` in group order; ``ops``:
    the member op names, in order."""

    __slots__ = ()

    def raw_source(self):
        """The body as a grid-stride RawKernel over ``i`` (arrays of the broadcast size, in
        group order: inputs, outputs, then ``long long n``), for NVRTC and the CPU shim."""
        from .shim import elementwise_raw_source

        preamble = f"typedef {C_TYPES[np.dtype(self.dtype)]} T;"
        return elementwise_raw_source(self.name, [(c, n) for _, c, n in self.inputs],
                                      [(c, n) for _, c, n in self.outputs], self.operation,
                                      preamble)

    def describe(self):
        return f"fused kernel '{self.name}' ({self.dtype}; ops: {' '.join(self.ops)})"


def _compute_dtype(group):
    """The float dtype the group was traced in (as the executor decides it): that of its float
    inputs, else of its first float member, else of its first output."""
    for x in group.inputs:
        if x.dtype.kind == "f":
            return x.dtype
    for m in group.members:
        if m.dtype.kind == "f":
            return m.dtype
    return group.outputs[0].dtype


def _run_dtypes(group, dtype):
    """dtypes of the inputs and members when the group computes in ``dtype``: values of the
    traced float dtype follow ``dtype``; masks and explicit casts keep theirs."""
    traced = _compute_dtype(group)

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
    input_dtypes, member_dtypes = _run_dtypes(group, dtype)
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


# --- compile checks (NVRTC, no GPU needed) ------------------------------------------------------

def compile_ptx(source, arch=None):
    """Compile ``source`` (an :class:`ElementwiseSource`) as its RawKernel with NVRTC; return the
    PTX. A failure raises :class:`KernelCompileError` naming the kernel and its ops, with the
    NVRTC log and the numbered source."""
    from . import nvrtc

    try:
        return nvrtc.compile_to_ptx(source.raw_source(), source.name,
                                    arch=arch or nvrtc.DEFAULT_ARCH,
                                    options=nvrtc.KERNEL_OPTIONS + nvrtc.CUPY_APPENDED_OPTIONS)
    except KernelCompileError as exc:
        raise _compile_error(source, exc.log, "NVRTC") from None


def _compile_error(source, log, compiler):
    body = numbered(source.raw_source())
    return KernelCompileError(
        f"{source.describe()} does not compile ({compiler}).\n"
        f"--- compiler log ---\n{str(log).strip()}\n"
        f"--- generated source (one line per op: the comment names it) ---\n{body}",
        log=str(log), source=source.raw_source())


# --- the fused kernels --------------------------------------------------------------------------

class _ShapePlan:
    """Per combination of input shapes: the output shapes and whether one elementwise launch
    can compute them (every output has the full broadcast shape of the inputs)."""

    __slots__ = ("full", "output_shapes", "fused")

    def __init__(self, kernel, input_shapes):
        shapes = list(input_shapes)
        for _, _, args in kernel.body:
            shapes.append(np.broadcast_shapes(*[shapes[a] for a in args]))
        self.full = np.broadcast_shapes(*input_shapes) if input_shapes else ()
        self.output_shapes = [shapes[s] for s in kernel.output_slots]
        self.fused = kernel.source is not None and all(
            s == self.full for s in self.output_shapes)


class GeneratedFusedKernel:
    """The call logic shared by the CuPy kernel and its CPU twin (the executor's ``FusedKernel``
    interface: ``kernel(*inputs, outs=None) -> tuple``).

    A group whose outputs do not all have the full broadcast shape (a member on the bias alone,
    ``(H,)``, read outside the group next to ``(N, H)`` members) cannot be one elementwise launch;
    it runs op by op, each op's own forward. So does a dtype without a generated kernel."""

    def __init__(self, group, xp, dtype):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.n_inputs = len(group.inputs)
        n = self.n_inputs
        where = {x.key: k for k, x in enumerate(group.inputs)}
        position = {m.key: j for j, m in enumerate(group.members)}
        self.body = [(m.op, dict(m.attrs), tuple(where[x.key] if x.key in where
                                                 else n + position[x.key] for x in m.inputs))
                     for m in group.members]
        self.output_slots = [n + position[o.key] for o in group.outputs]
        try:
            self.source = elementwise_source(group, self.dtype)
        except KernelCompileError:
            self.source = None  # not generated (e.g. float16): op by op
        _, member_dtypes = _run_dtypes(group, self.dtype)
        self.output_dtypes = [member_dtypes[s - n] for s in self.output_slots]
        self.describe = " ".join(m.op.name for m in group.members)
        self._plans = {}

    def __call__(self, *inputs, outs=None):
        if len(inputs) != self.n_inputs:
            raise GraphError(f"fused kernel ({self.describe}) takes {self.n_inputs} inputs, got "
                             f"{len(inputs)}")
        shapes = tuple(tuple(np.shape(a)) for a in inputs)
        plan = self._plans.get(shapes)
        if plan is None:
            plan = self._plans[shapes] = _ShapePlan(self, shapes)
        if not plan.fused:
            return self._op_by_op(inputs, outs)
        xp = self.xp
        results = [xp.empty(s, d) if o is None else o for s, d, o in zip(
            plan.output_shapes, self.output_dtypes, outs or [None] * len(self.output_slots))]
        if math.prod(plan.full):
            self._launch(plan, inputs, results)
        return tuple(results)

    def _op_by_op(self, inputs, outs):
        values = list(inputs)
        for op, attrs, args in self.body:
            values.append(op.forward(self.xp, *[values[a] for a in args], **attrs))
        results = [values[s] for s in self.output_slots]
        for p, out in enumerate(outs or ()):
            if out is not None:
                out[...] = results[p]
                results[p] = out
        return tuple(results)

    def _launch(self, plan, inputs, results):
        raise NotImplementedError

    def __repr__(self):
        name = self.source.name if self.source is not None else "op by op"
        return f"{type(self).__name__}({name}: {self.describe}; {self.dtype})"


class CupyFusedKernel(GeneratedFusedKernel):
    """A fused group as one ``cupy.ElementwiseKernel`` (built on first launch, shared by every
    group with the same signature and dtype). The executor's factory for ``"cupy"``."""

    def _launch(self, plan, inputs, results):
        from cupy.cuda.compiler import CompileException

        kernel = _elementwise_kernel(self.source)
        try:
            kernel(*inputs, *results)  # compiled by CuPy on the first launch
        except CompileException as exc:
            raise _compile_error(self.source, exc, "CuPy/NVRTC") from None


@functools.lru_cache(maxsize=None)
def _elementwise_kernel(source):
    import cupy  # lazily: only CuPy arrays reach here

    from . import nvrtc
    from .errors import ToolchainError

    try:  # let CuPy < 14 find the NVRTC wheel too (see nvrtc.py)
        nvrtc.load_nvrtc()
    except ToolchainError:
        pass
    return cupy.ElementwiseKernel(source.in_params, source.out_params, source.operation,
                                  source.name, preamble=source.preamble,
                                  options=nvrtc.KERNEL_OPTIONS)


class ShimFusedKernel(GeneratedFusedKernel):
    """The CPU twin of :class:`CupyFusedKernel` (NumPy arrays): the same generated body, as its
    RawKernel compiled by g++ (the shim), with the inputs broadcast to the full shape on the
    host first. ``register_kernel_factory("numpy", ShimFusedKernel)`` runs a whole vertex
    function's fused groups through generated C, which is how the tests check it end to end.
    ``ftz``: the shim's flush-to-zero mode (None: as on the GPU, on for float32)."""

    def __init__(self, group, xp, dtype, ftz=None):
        super().__init__(group, xp, dtype)
        self.ftz = ftz

    def _launch(self, plan, inputs, results):
        source = self.source
        kernel = _shim_kernel(source)
        full = plan.full
        args = [np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype=d), full))
                for a, (d, _, _) in zip(inputs, source.inputs)]
        outs = [r if r.flags.c_contiguous and r.dtype == np.dtype(d) else np.empty(full, d)
                for r, (d, _, _) in zip(results, source.outputs)]
        total = math.prod(full)
        blocks = min(-(-total // BLOCK_SIZE), MAX_BLOCKS)
        kernel((blocks,), (BLOCK_SIZE,), (*args, *outs, total), ftz=self.ftz)
        for r, o in zip(results, outs):
            if r is not o:
                r[...] = o


_SHIM_KERNELS = {}  # ElementwiseSource -> its compiled ShimKernel


def _shim_kernel(source):
    kernel = _SHIM_KERNELS.get(source)
    if kernel is None:
        build_shim_kernels([source])
        kernel = _SHIM_KERNELS[source]
    return kernel


def build_shim_kernels(sources):
    """Compile the CPU twins of many generated kernels with one g++ run per dtype (a test of
    dozens of groups would otherwise pay one compiler start per kernel); already compiled ones
    are skipped. A failure raises :class:`KernelCompileError` naming the kernels and their ops."""
    from .shim import shim_module

    by_dtype = {}
    for source in sources:
        if source not in _SHIM_KERNELS:
            by_dtype.setdefault(source.dtype, {})[source.name] = source
    for dtype, named in by_dtype.items():
        unit = "\n".join(s.raw_source() for s in named.values())  # typedef T repeats: legal C++
        tag = next(iter(named)) if len(named) == 1 else f"minicavs_fused_{len(named)}_{dtype}"
        try:
            module = shim_module(unit, tag)
        except KernelCompileError as exc:
            if len(named) == 1:
                raise _compile_error(next(iter(named.values())), exc.log, "g++ shim") from None
            raise KernelCompileError(
                f"{len(named)} fused kernels ({dtype}) do not compile together (g++ shim):\n"
                + "\n".join(s.describe() for s in named.values()) + "\n" + str(exc),
                log=exc.log, source=unit) from None
        for name, source in named.items():
            _SHIM_KERNELS[source] = module.get_function(name)
