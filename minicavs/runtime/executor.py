"""Running a static graph step by step, with fused elementwise groups (Cavs §3.4).

A *step* is either one op node (:class:`OpStep`) or one fused group (:class:`GroupStep`); both
read their inputs from an environment ``env`` (``symbol.key -> array``), write their outputs
into it, and can be told to write an output into a preallocated array instead of a new one
(``outs``: ``symbol.key -> array``). That is all the vertex runtime needs to run *subsets* of a
graph — eager steps once, core steps per level on row blocks, lazy steps at the end — into its
batch buffers; :func:`run_steps` runs a list of steps (the driver runs Programs of steps;
``Graph.evaluate``, the reference, runs a graph op by op without them).

A fused group runs through one interface: :func:`make_fused_kernel` returns a
:class:`FusedKernel`, a callable ``kernel(*inputs, outs=None) -> tuple of outputs`` built once
per group *signature* (ops, attributes, wiring, input dtypes and ranks; see
:meth:`FusedGroup.signature`), array module and dtype, and cached. Which class builds it is
chosen per array module by :func:`register_kernel_factory`: NumPy gets
:class:`NumpyFusedKernel`; the CUDA layer registers a factory for ``"cupy"`` that generates one
``cupy.ElementwiseKernel`` from the ops' C expressions; any other module falls back to
:class:`OpByOpKernel` (each op's own forward, which works on any ``xp``).

How to run a fused group fastest on the CPU was measured (``benchmarks/fusion_cpu.py``: the
Tree-LSTM cell groups of F and ∂F, float32, N in {16, 64, 512}, H in {128, 256}). NumPy ufuncs
writing with ``out=`` into buffers reused across calls (:class:`NumpyFusedKernel`) were the
fastest or within noise of it at every size, 1.2-2.7x faster than op-by-op NumPy. Most of the
gain on F is the sigmoid: ``1 / (1 + exp(-x))`` as four SIMD ufuncs is about 4x faster than
``scipy.special.expit`` (what the op's forward used then); writing with ``out=`` adds 5-30%, most
on ∂F at large N. numexpr (no VML on this machine, so scalar float32 tanh/exp) was 3-6x slower,
a generated numba loop 3-8x slower on F and at best even on ∂F, and running the ufuncs on row
blocks of ~16K elements for cache locality gained nothing.
"""

import contextlib
import threading

import numpy as np

from .. import backend
from ..cpu import fused as native_fused, kernels as native_kernels
from ..csource import compute_dtype
from ..errors import GraphError
from ..ops import registry
from .analysis import FusedGroup, fusion_groups, schedule


# --- steps --------------------------------------------------------------------------------------

def _value(env, x, xp):
    """``env[x.key]``; a constant not yet in ``env`` is put there (on ``xp``'s device)."""
    try:
        return env[x.key]
    except KeyError:
        if x.kind == "const":
            value = x.value if xp is np else xp.asarray(x.value)
            env[x.key] = value
            return value
        raise GraphError(f"no value for {x!r} (a {x.kind}) in the environment; the steps that "
                         f"produce it must run first, and inputs and parameters must be bound"
                         ) from None


class _Record:
    """The "array module" of a replay on Tensors: each op is applied with ``registry.apply``, so
    it is recorded for autodiff (``backward(create_graph=True)`` through a static function)."""

    __name__ = "record"

    def __repr__(self):
        return "RECORD"


RECORD = _Record()


def _record(node, env, attrs):
    env[node.key] = registry.apply(node.op, *[env[x.key] for x in node.inputs], **attrs)


class OpStep:
    """One op node run by itself. ``attrs`` may replace the node's attributes (the vertex
    runtime uses that to give a task's real sizes to attributes recorded symbolically)."""

    __slots__ = ("node", "attrs", "inputs", "outputs")

    def __init__(self, node, attrs=None):
        if node.kind != "op":
            raise GraphError(f"OpStep: {node!r} is not an op node")
        self.node = node
        self.attrs = node.attrs if attrs is None else attrs
        self.inputs = list(node.inputs)
        self.outputs = [node]

    def run(self, xp, env, outs=None):
        node = self.node
        if xp is RECORD:
            return _record(node, env, self.attrs)
        try:
            args = [env[x.key] for x in node.inputs]
        except KeyError:  # (a constant not in env yet, or a value missing: _value says which)
            args = [_value(env, x, xp) for x in node.inputs]
        out = outs.get(node.key) if outs else None
        if out is None:
            env[node.key] = node.op.forward(xp, *args, **self.attrs)
        else:
            env[node.key] = _forward_into(node, xp, args, self.attrs, out)

    def __repr__(self):
        return f"OpStep({self.node.op.name} -> {self.node.shape})"


def _forward_into(node, xp, args, attrs, out):
    """Run ``node`` writing its value into ``out``: with the op's writer (``op.into``) where it
    has one — an elementwise op's writer on NumPy only; on CuPy an elementwise op is one
    generated kernel writing there (computing and copying would be two launches) — else
    computed and copied."""
    op = node.op
    if op.into is not None and (xp is np or not op.is_elementwise):
        with np.errstate(over="ignore") if op.quiet_overflow else contextlib.nullcontext():
            op.into(*args, out, **attrs)
        return out
    if op.is_elementwise and xp is not np and xp is not RECORD and attrs is node.attrs and \
            len({x.key for x in node.inputs}) == len(node.inputs):
        group = FusedGroup([node], node.inputs, [node])
        return make_fused_kernel(group, xp, compute_dtype(group, args))(*args, outs=[out])[0]
    out[...] = op.forward(xp, *args, **attrs)
    return out


class GroupStep:
    """A fused group run as one unit through a :class:`FusedKernel` (one per array module and
    dtype, from :func:`make_fused_kernel`)."""

    __slots__ = ("group", "inputs", "outputs", "_kernels")

    def __init__(self, group):
        self.group = group
        self.inputs = group.inputs
        self.outputs = group.outputs
        self._kernels = {}

    def kernel(self, xp, dtype):
        key = (xp.__name__, dtype)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = make_fused_kernel(self.group, xp, dtype)
        return k

    def run(self, xp, env, outs=None):
        if xp is RECORD:  # member by member: a fused kernel has no gradient of its own
            for m in self.group.members:
                _record(m, env, m.attrs)
            return
        try:
            args = [env[x.key] for x in self.group.inputs]
        except KeyError:
            args = [_value(env, x, xp) for x in self.group.inputs]
        kernel = self.kernel(xp, compute_dtype(self.group, args))
        out_arrays = [outs.get(o.key) for o in self.group.outputs] if outs else None
        results = kernel(*args, outs=out_arrays)
        for o, r in zip(self.group.outputs, results):
            env[o.key] = r

    def __repr__(self):
        return f"GroupStep({self.group!r})"


class SummedCellStep:
    """An LSTM cell (``ops/cells.py``) whose gate pre-activations are a fused group of adds —
    an LSTM step's two products and its bias, as automatic batching writes a step: one kernel
    adds the terms, keeps the sum (the cell's gradient reads it) and runs the cell, in the
    cell's pass over the rows (``lstm_cell_sum`` of ``cpu/kernels.py``, of
    ``cuda/kernels.py``: on a GPU a launch fewer); where it does not apply, the group, then the
    cell."""

    __slots__ = ("sum", "cell", "terms", "inputs", "outputs")

    def __init__(self, sum_step, cell_step, terms):
        self.sum, self.cell, self.terms = sum_step, cell_step, terms  # terms: in adding order
        pre = sum_step.outputs[0]
        self.inputs = list(sum_step.inputs) + [x for x in cell_step.inputs if x.key != pre.key]
        self.outputs = [pre, cell_step.node]

    def run(self, xp, env, outs=None):
        if xp is not RECORD:
            pre, cell = self.outputs
            outs = outs or {}
            if xp is np:
                kernels = native_kernels
            else:
                from ..cuda import kernels
            done = kernels.lstm_cell_sum(
                [_value(env, t, xp) for t in self.terms],
                [_value(env, c, xp) for c in cell.inputs[1:]], outs.get(cell.key),
                outs.get(pre.key))
            if done is not None:
                env[pre.key], env[cell.key] = done
                return
        self.sum.run(xp, env, outs)
        self.cell.run(xp, env, outs)

    @property
    def members(self):  # (as a group's, for Program.dump)
        return FusedGroup(self.sum.group.members + [self.cell.node], self.inputs, self.outputs)

    def __repr__(self):
        return f"SummedCellStep({len(self.terms)} terms -> {self.cell.node.shape})"


def plan_steps(graph, fuse=True, groups=None, **fusion_options):
    """The op nodes of ``graph`` as steps in an order they can run: with ``fuse``, fused groups
    (``groups``, or ``fusion_groups(graph, **fusion_options)``) become :class:`GroupStep`
    objects and the other op nodes :class:`OpStep` objects; without, every op node is an
    :class:`OpStep`."""
    if not fuse:
        groups = []
    elif groups is None:
        groups = fusion_groups(graph, **fusion_options)
    return [GroupStep(s) if isinstance(s, FusedGroup) else OpStep(s)
            for s in schedule(graph, groups)]


def run_steps(steps, env, xp=None, outs=None):
    """Run ``steps`` in order on the environment ``env`` (``symbol.key -> array``), which must
    already hold every input the steps read from outside themselves (constants are added on
    first use). ``outs`` (``symbol.key -> array``) gives preallocated arrays for some step
    outputs: those values are written there (they must not overlap the step's inputs). ``xp``
    defaults to the module of the first array in ``env``. Returns ``env``."""
    if xp is None:
        xp = backend.get_array_module(*[v for v in env.values() if hasattr(v, "shape")][:1])
    for step in steps:
        step.run(xp, env, outs)
    return env


# --- fused kernels ------------------------------------------------------------------------------

class FusedKernel:
    """The interface of a compiled fused group: ``kernel(*inputs, outs=None)`` takes the arrays
    of ``group.inputs`` in order and returns a tuple with the arrays of ``group.outputs``.
    ``outs`` is None or a list with, per output, a preallocated array or None; given arrays
    are written and returned. A kernel never returns its internal scratch memory, so results
    stay valid across calls. Subclasses set up in ``__init__(group, xp, dtype)`` and implement
    ``__call__``; a kernel may keep per-shape plans and scratch buffers, but must not keep
    references to the group's symbols' identities (it is shared by every group with the same
    signature)."""

    def __init__(self, group, xp, dtype):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.n_inputs = len(group.inputs)
        position = {m.key: j for j, m in enumerate(group.members)}
        where = {x.key: k for k, x in enumerate(group.inputs)}
        n = len(group.inputs)
        # Slots: 0..n-1 are the inputs, n+j is member j.
        self.body = []  # per member: (op, attrs, argument slots)
        for j, m in enumerate(group.members):
            args = tuple(where[x.key] if x.key in where else n + position[x.key]
                         for x in m.inputs)
            self.body.append((m.op, dict(m.attrs), args))
        self.output_slots = [n + position[o.key] for o in group.outputs]
        # Members of the group's traced float dtype compute in the kernel's dtype; the others
        # (masks, and the results of an explicit astype) keep the dtype they were traced with.
        traced = compute_dtype(group)
        self.member_dtypes = [self.dtype if m.dtype == traced else m.dtype
                              for m in group.members]
        self.describe = " ".join(m.op.name for m in group.members)

    def __call__(self, *inputs, outs=None):
        raise NotImplementedError

    def _check(self, inputs):
        if len(inputs) != self.n_inputs:
            raise GraphError(f"fused kernel ({self.describe}) takes {self.n_inputs} inputs, got "
                             f"{len(inputs)}")

    def __repr__(self):
        return f"{type(self).__name__}({self.describe}; {self.xp.__name__}, {self.dtype})"


class OpByOpKernel(FusedKernel):
    """Each member's own ``op.forward``, one call after another, each allocating its result.
    Works on any array module; strategy (a) of the benchmark, and the fallback."""

    def __call__(self, *inputs, outs=None):
        self._check(inputs)
        xp = self.xp
        values = list(inputs)
        for op, attrs, args in self.body:
            values.append(op.forward(xp, *[values[a] for a in args], **attrs))
        results = [values[s] for s in self.output_slots]
        if outs:
            for i, out in enumerate(outs):
                if out is not None:
                    out[...] = results[i]
                    results[i] = out
        return tuple(results)


# Other ways to write a sigmoid than the op's own 1/(1+exp(-x)), compared by the benchmark:
# NumpyFusedKernel(group, np, dtype, writers={SIGMOID: (sigmoid_tanh_into, True)}).

def sigmoid_tanh_into(x, out):
    # (tanh(x/2) + 1) / 2: as fast, but it loses relative accuracy in the lower tail (σ(-20) in
    # float32 becomes 0), which matters to log(σ(x)).
    t = out.dtype.type
    np.multiply(x, t(0.5), out=out)
    np.tanh(out, out=out)
    np.multiply(out, t(0.5), out=out)
    np.add(out, t(0.5), out=out)


def sigmoid_expit_into(x, out):
    import scipy.special

    scipy.special.expit(x, out=out)


class NumpyFusedKernel(FusedKernel):
    """A fused group as NumPy ufunc calls writing with ``out=`` (the CPU winner; see the module
    docstring). For each combination of input shapes it makes a plan once: every member's
    shape, and where its value goes — a group output gets its own array (new, or the caller's
    ``outs``), an intermediate gets a scratch buffer, reused by a later member once its value is
    dead (in place when that member reads it and the op allows it). Scratch buffers are kept per
    thread and reused across calls, so a steady loop allocates only the outputs; calls of every
    shape share them (``_scratch``).

    Each member is written by its op's writer (``op.into``); ``writers`` (``{op: (writer,
    in_place)}``) replaces some, e.g. the sigmoid formulas the benchmark compares."""

    def __init__(self, group, xp, dtype, writers=None):
        super().__init__(group, xp, dtype)
        writers = writers or {}
        # Per member: (writer, in-place allowed); None: no writer, use op.forward and copy.
        self.writers = [writers.get(op) or ((op.into, op.in_place) if op.into else None)
                        for op, _, _ in self.body]
        # sigmoid's exp(-x) overflows to inf for x < -88 (float32), harmlessly: σ is then
        # 1/inf = 0. Silencing that costs ~1 µs per call, so only groups with such an op pay it
        # (and an exp of the user's in such a group then overflows silently too).
        self.quiet_overflow = any(op.quiet_overflow for op, _, _ in self.body)
        self._plans = {}
        self._local = threading.local()
        # The group as one native loop where the inputs allow (cpu/fused.py), else the plan
        self._native = native_fused.source_for(group, dtype) if xp is np else None

    def _scratch(self, plan):
        """Views of this thread's scratch arrays in ``plan``'s shapes. One flat array per
        scratch slot, grown to the largest size seen: a batch's levels of every size share it,
        so the memory kept is one level's, not one per level size."""
        local = self._local.__dict__
        flat = local.setdefault("flat", {})  # (slot, dtype) -> 1-D array
        for k, (shape, dtype) in enumerate(plan.scratch_specs):
            size = int(np.prod(shape))
            if flat.get((k, dtype)) is None or flat[(k, dtype)].size < size:
                flat[(k, dtype)] = np.empty(size, dtype)
                local["views"] = {}  # views of the old arrays must not keep them alive
        return [flat[(k, d)][:int(np.prod(s))].reshape(s)
                for k, (s, d) in enumerate(plan.scratch_specs)]

    def __call__(self, *inputs, outs=None):
        if len(inputs) != self.n_inputs:
            self._check(inputs)
        if self._native is not None:
            done = native_fused.run(self._native, inputs, outs)
            if done is not None:
                return done
        shapes = tuple([np.shape(a) for a in inputs])
        plan = self._plans.get(shapes)
        if plan is None:
            plan = self._plans[shapes] = _Plan(self, shapes)
        buffers = self._local.__dict__.setdefault("views", {}).get(plan.key)
        if buffers is None:
            buffers = self._scratch(plan)
            self._local.views[plan.key] = buffers
        if outs:
            results = [np.empty(s, d) if o is None else o
                       for (s, d), o in zip(plan.output_specs, outs)]
        else:
            results = [np.empty(s, d) for s, d in plan.output_specs]
        values = list(inputs)
        values.extend(buffers[k] if scratch_k else results[k] for scratch_k, k in plan.storage)
        if self.quiet_overflow:
            with np.errstate(over="ignore"):
                _execute(plan.code, values)
        else:
            _execute(plan.code, values)
        return tuple(results)


def _execute(code, values):
    """Run a plan's instructions; ``values[slot]`` holds every input and every member's array
    (already its output buffer, so running an instruction fills it)."""
    for fn, args, out, attrs, op in code:
        if op is not None:  # no writer: the op's own forward, copied in
            values[out][...] = op.forward(np, *[values[a] for a in args], **attrs)
        elif attrs:
            fn(*[values[a] for a in args], values[out], **attrs)
        elif len(args) == 1:
            fn(values[args[0]], values[out])
        elif len(args) == 2:
            fn(values[args[0]], values[args[1]], values[out])
        else:
            fn(*[values[a] for a in args], values[out])


class _Plan:
    """Shapes and storage of a :class:`NumpyFusedKernel`'s members for one set of input shapes."""

    def __init__(self, kernel, input_shapes):
        n = kernel.n_inputs
        shapes = list(input_shapes)
        for op, attrs, args in kernel.body:
            shapes.append(np.broadcast_shapes(*[shapes[a] for a in args]))
        last_use = {}
        for j, (_, _, args) in enumerate(kernel.body):
            for a in args:
                last_use[a] = j
        output_of = {slot: i for i, slot in enumerate(kernel.output_slots)}
        self.output_specs = [(shapes[s], kernel.member_dtypes[s - n])
                             for s in kernel.output_slots]
        self.storage = []  # per member: (True, scratch index) or (False, output position)
        self.scratch_specs = []
        free = []  # indices of scratch buffers whose value is dead
        holder = {}  # member slot -> scratch index holding its value
        for j, (op, attrs, args) in enumerate(kernel.body):
            slot = n + j
            shape, dtype = shapes[slot], kernel.member_dtypes[j]
            # Scratch buffers whose value dies at this member: free for reuse after it (and by
            # it, writing in place, if the op allows that).
            dying = sorted({holder[a] for a in args if a in holder and last_use[a] == j})
            chosen = None
            if slot in output_of:
                self.storage.append((False, output_of[slot]))
            else:
                in_place = kernel.writers[j] is not None and kernel.writers[j][1]
                fits = [k for k in (dying if in_place else []) + free
                        if self.scratch_specs[k] == (shape, dtype)]
                if fits:
                    chosen = fits[0]
                    if chosen in free:
                        free.remove(chosen)
                else:
                    chosen = len(self.scratch_specs)
                    self.scratch_specs.append((shape, dtype))
                self.storage.append((True, chosen))
                holder[slot] = chosen
            free.extend(k for k in dying if k != chosen)
        self.key = (input_shapes, tuple(self.scratch_specs))
        # Instructions for _execute: (writer, argument slots, output slot, attrs, op or None).
        self.code = []
        for j, (op, attrs, args) in enumerate(kernel.body):
            writer = kernel.writers[j]
            self.code.append((writer[0] if writer else None, args, n + j, attrs,
                              None if writer else op))


# --- the kernel factory ---------------------------------------------------------------------------

_FACTORIES = {"numpy": NumpyFusedKernel}
_KERNELS = {}


def register_kernel_factory(module_name, factory):
    """Use ``factory(group, xp, dtype)`` to build the fused kernels for arrays of the module
    named ``module_name`` (``"numpy"``, ``"cupy"``). The CUDA layer registers its
    ``cupy.ElementwiseKernel`` generator here. Clears the kernel cache for that module."""
    _FACTORIES[module_name] = factory
    for key in [k for k in _KERNELS if k[1] == module_name]:
        del _KERNELS[key]


def _builtin_factory(module_name):
    """The factory for a module nothing was registered for. CuPy's is the CUDA layer's
    ElementwiseKernel generator, imported (and registered) on first use, so that ``import
    minicavs`` never imports CuPy; other modules run op by op."""
    if module_name == "cupy":
        from ..cuda.fusion import CupyFusedKernel

        register_kernel_factory("cupy", CupyFusedKernel)
        return CupyFusedKernel
    return OpByOpKernel


def make_fused_kernel(group, xp, dtype, factory=None):
    """The :class:`FusedKernel` for ``group`` on array module ``xp`` computing in ``dtype``,
    cached by (group signature, module, dtype, factory): groups with equal signatures share
    one kernel. ``factory`` overrides the registered one (the benchmark uses that)."""
    dtype = np.dtype(dtype)
    factory = factory or _FACTORIES.get(xp.__name__) or _builtin_factory(xp.__name__)
    key = (group.signature(), xp.__name__, dtype.str, factory)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = _KERNELS[key] = factory(group, xp, dtype)
    return kernel
