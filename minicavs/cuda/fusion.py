"""Fusion code generation: one ``cupy.ElementwiseKernel`` per fused group (Cavs §3.4).

A fused group's C body is ``csource.elementwise_source`` (the texts an ElementwiseKernel is made
of, shared with the native CPU loops); the kernel is built once per source, so every group with
the same signature and dtype shares it. :class:`CupyFusedKernel` is the executor's
:class:`~minicavs.runtime.executor.FusedKernel` for CuPy arrays; the executor imports it on first
use (``import minicavs`` never imports CuPy). A body that does not compile raises
:class:`~minicavs.errors.KernelCompileError` with the generated source, numbered, and the ops.

Checked without a GPU: :func:`raw_source` wraps the same ``operation`` into a
grid-stride RawKernel (``shim.elementwise_raw_source``, one thread per element i) that NVRTC
compiles for compute_90 and the g++ shim runs on the CPU; :class:`ShimFusedKernel` is the
CuPy kernel's CPU twin (same call logic, inputs broadcast on the host, body run by the shim).
Both sides compile without contraction (``nvrtc.KERNEL_OPTIONS``), and the shim runs float32
bodies with subnormals flushed, as CuPy's ``-ftz=true`` makes the GPU do. The C expressions
follow NumPy's NaN rules (``ops/elementwise.py``); the math functions (exp, log, tanh, pow)
are the GPU's and libm's, equal to NumPy's within a few units in the last place.
"""

import functools
import math

import numpy as np

from ..csource import C_TYPES, elementwise_source, numbered, run_dtypes
from ..errors import GraphError, KernelCompileError

BLOCK_SIZE = 256  # the shim's launch shape (its kernels are grid-stride loops)
MAX_BLOCKS = 4096


def raw_source(source):
    """The body of ``source`` (an ``ElementwiseSource``) as a grid-stride RawKernel over ``i``
    (arrays of the broadcast size, in group order: inputs, outputs, then ``long long n``), for
    NVRTC and the CPU shim."""
    from .shim import elementwise_raw_source

    preamble = f"typedef {C_TYPES[np.dtype(source.dtype)]} T;"
    return elementwise_raw_source(source.name, [(c, n) for _, c, n in source.inputs],
                                  [(c, n) for _, c, n in source.outputs], source.operation,
                                  preamble)


# --- compile checks (NVRTC, no GPU needed) ------------------------------------------------------

def compile_ptx(source, arch=None):
    """Compile ``source`` (an :class:`ElementwiseSource`) as its RawKernel with NVRTC; return the
    PTX. A failure raises :class:`KernelCompileError` naming the kernel and its ops, with the
    NVRTC log and the numbered source."""
    from . import nvrtc

    try:
        return nvrtc.compile_to_ptx(raw_source(source), source.name,
                                    arch=arch or nvrtc.DEFAULT_ARCH,
                                    options=nvrtc.KERNEL_OPTIONS + nvrtc.CUPY_APPENDED_OPTIONS)
    except KernelCompileError as exc:
        raise _compile_error(source, exc.log, "NVRTC") from None


def _compile_error(source, log, compiler):
    body = numbered(raw_source(source))
    return KernelCompileError(
        f"{source.describe()} does not compile ({compiler}).\n"
        f"--- compiler log ---\n{str(log).strip()}\n"
        f"--- generated source (one line per op: the comment names it) ---\n{body}",
        log=str(log), source=raw_source(source))


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
        _, member_dtypes = run_dtypes(group, self.dtype)
        self.output_dtypes = [member_dtypes[s - n] for s in self.output_slots]
        self.describe = " ".join(m.op.name for m in group.members)
        self._plans = {}

    def __call__(self, *inputs, outs=None):
        if len(inputs) != self.n_inputs:
            raise GraphError(f"fused kernel ({self.describe}) takes {self.n_inputs} inputs, got "
                             f"{len(inputs)}")
        shapes = tuple([getattr(a, "shape", None) or np.shape(a) for a in inputs])
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

    _kernel = None

    def _launch(self, plan, inputs, results):
        if self._kernel is None:  # (once: a level loop launches it every level)
            from ..backend import _import_cupy  # CuPy's, or the emulated device's

            self._failure = _import_cupy().cuda.compiler.CompileException
            self._kernel = _elementwise_kernel(self.source)
        try:
            self._kernel(*inputs, *results)  # compiled by CuPy on the first launch
        except self._failure as exc:
            raise _compile_error(self.source, exc, "CuPy/NVRTC") from None


@functools.lru_cache(maxsize=None)
def _elementwise_kernel(source):
    from . import nvrtc  # lazily: only CuPy (or emulated) arrays reach here

    return nvrtc.cupy_for_kernels().ElementwiseKernel(
        source.in_params, source.out_params, source.operation, source.name,
        preamble=source.preamble, options=nvrtc.KERNEL_OPTIONS)


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
        unit = "\n".join(raw_source(s) for s in named.values())  # typedef T repeats: legal C++
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
