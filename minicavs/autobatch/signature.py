"""Signatures: which recorded nodes may run as one batch, and the batched kernel they run.

Two nodes have the same signature when they apply the same op with the same attributes to
operands of the same per-node shapes and dtypes, and share the same *shared* operands (the
parameters, by identity, and scalar constants, by value); their other operands are stacked
along a new leading axis, one row per node. The batched kernel is the op's batching rule
(``op.batch``) traced once on symbols with a leading axis of the symbolic size ``VERTICES``, as
for a vertex function's batching task; its ∂ is derived symbolically (``grad_graph``), so the
parameter gradient of ``x @ W`` over a batch is one product Xᵀ·G, as in ∂F.
"""

import weakref
from collections import Counter

import numpy as np

from ..errors import MinicavsError
from ..autodiff.symbolic import Graph, Tracer, grad_graph
from ..autodiff.tensor import Tensor
from ..locations import format_location, user_location
from ..ops.batching import VERTICES, row_domain
from ..ops.registry import Aval, apply
from ..ops.shape import reshape
from ..runtime import driver
from ..runtime.executable import Executable
from ..runtime.passes import compile_graph


# One Aval object per (shape, dtype) among the signatures' outputs: the recorder's caches key a
# node's form by its Aval's identity (``views.view_key``, the scope's fast path), and one per
# signature per scope grew those caches by every mini-batch (30 entries a step of a small
# tagger, without end).
_AVALS = {}


def interned_aval(shape, dtype):
    """The one Aval of ``shape`` (a tuple of ints) and ``dtype`` (an np.dtype)."""
    aval = _AVALS.get((shape, dtype))
    if aval is None:
        aval = _AVALS[(shape, dtype)] = Aval(shape, dtype)
    return aval


class Signature:
    """One signature: the op, its attributes, and per operand either a per-row aval or the
    shared value (a Tensor or a 0-d constant array). Kernels are built on first use."""

    __slots__ = ("id", "op", "attrs", "row_avals", "shared", "out", "grad_enabled", "nodes",
                 "arg_rows", "arity", "_forward", "label", "can_grad", "local", "_detached",
                 "per_node", "where")

    def __init__(self, sig_id, op, attrs, row_avals, shared, grad_enabled):
        self.id = sig_id
        self.op, self.attrs = op, attrs
        self.row_avals = row_avals  # per operand: Aval of one row, or None when shared
        self.shared = shared  # per operand: the shared Tensor / constant array, or None
        self.arity = sum(a is not None for a in row_avals)  # per-row operands
        self.grad_enabled = grad_enabled
        avals = [a if a is not None else Aval(tuple(s.shape), np.dtype(s.dtype))
                 for a, s in zip(row_avals, shared)]
        # the user's line that made the form first: an error of a batch names it (a form is
        # new once a process, so looking for it costs nothing in a step)
        self.where = user_location()
        try:
            out = op.infer(*avals, **attrs)
        except MinicavsError as exc:
            raise type(exc)(str(exc) + format_location(self.where)) from None
        self.out = interned_aval(tuple(int(d) for d in out.shape), np.dtype(out.dtype))
        self.nodes = []  # indices of the recorded nodes of this signature, in recording order
        self.arg_rows = []  # flat: per node, the source id of each per-row operand
        self._forward = None
        self._detached = None  # its copy in the cache of learned signatures, if any
        self.per_node = False  # True: its kernel runs one node (the op has no batching rule)
        parts = [str(tuple(a.shape)) if a is not None
                 else "W" if hasattr(s, "requires_grad") else "c"
                 for a, s in zip(row_avals, shared)]
        if len(parts) > 3 and len(set(parts)) == 1:  # concat of many: "12x(1,)"
            parts = [f"{len(parts)}x{parts[0]}"]
        shapes = ",".join(parts)
        self.label = f"{op.name}{shapes and ' ' + shapes}"

    def detached(self, on_collected):
        """This signature for the cache of learned ones (``scope._LEARNED``): no nodes, its
        shared Tensors held by weak references, ``on_collected`` called when one is
        collected."""
        copy = self._copy()
        copy.shared = [weakref.ref(s, on_collected) if isinstance(s, Tensor) else s
                       for s in self.shared]
        copy.nodes = copy.arg_rows = None
        self._detached = copy
        return copy

    def attached(self, sig_id):
        """A scope's signature from a detached one, numbered ``sig_id``; None when one of its
        shared Tensors is gone."""
        shared = []
        for s in self.shared:  # (None: a per-row operand)
            if isinstance(s, weakref.ref):
                s = s()
                if s is None:
                    return None
            shared.append(s)
        sig = self._copy()
        sig.id, sig.shared, sig.nodes, sig.arg_rows, sig.local = sig_id, shared, [], [], -1
        sig._detached = self
        return sig

    def _copy(self):
        copy = object.__new__(Signature)
        for name in Signature.__slots__:
            setattr(copy, name, getattr(self, name))
        return copy

    def shared_grads(self):
        """Positions of the shared operands that get a gradient (Tensors requiring grad)."""
        return [i for i, s in enumerate(self.shared)
                if s is not None and getattr(s, "requires_grad", False)]

    @property
    def forward(self):
        if self._forward is None:
            key = self.structure()
            kernel = _KERNELS.pop(key, None)  # (put back last: the least recent goes first)
            if kernel is None:
                kernel = _batched_or_per_node(self)
                while len(_KERNELS) >= _KERNELS_KEPT:
                    drop_oldest(_KERNELS)
            _KERNELS[key] = kernel
            self._forward = kernel
            if kernel.per_node:
                self.per_node = True
                self.label += " (per node)"
            if self._detached is not None:  # (the next scope's copy starts with it)
                self._detached._forward = kernel
        return self._forward

    def structure(self):
        """What the batched kernel depends on: the op, its attributes, per operand the per-row
        aval, a shared Tensor's aval and whether it needs a gradient (its value is read at
        each run, so not its identity), or a constant's bytes (-0.0 is not 0.0, NaN is NaN)."""
        attrs = tuple(self.attrs.items())
        try:
            hash(attrs)
        except TypeError:  # an unhashable attribute
            attrs = repr(self.attrs)
        parts = [self.op, self.grad_enabled, attrs]
        for row, value in zip(self.row_avals, self.shared):
            if row is not None:
                parts.append(("row", tuple(row.shape), np.dtype(row.dtype).str))
            elif hasattr(value, "requires_grad"):
                parts.append(("shared", tuple(value.shape), np.dtype(value.dtype).str,
                              bool(value.requires_grad)))
            else:
                parts.append(("const", np.dtype(value.dtype).str, np.asarray(value).tobytes()))
        return tuple(parts)


BATCH_OF = "an mc.autobatch batch of op"  # a batched kernel's program, as messages name it

# Batched kernels by structure (``Signature.structure``): traced, and their ∂ derived, once per
# process rather than once per scope — a training loop opens a scope per mini-batch.
_KERNELS = {}
_KERNELS_KEPT = 4096  # (a constant per node, x * float(i), makes a kernel each)


def drop_oldest(cache):
    """Remove a bounded cache's oldest entry (dicts keep their order): another thread may be
    doing the same, so a key already gone, or a dict changed between taking its first key and
    removing it, is not an error."""
    try:
        cache.pop(next(iter(cache)), None)
    except (RuntimeError, StopIteration):
        pass


def _batched_or_per_node(sig):
    """The signature's batched kernel, or, where the op has no batching rule for these operands
    (a per-row table of ``take_rows``: ``h[::-1]``; a rule that refuses a form), a kernel of
    one node: such nodes run one by one, as eager code runs them, never an error eager code
    would not raise."""
    if sig.op.batch is not None:
        try:
            kernel = BatchedKernel(sig)
            if tuple(kernel.output.shape) == (VERTICES,) + tuple(sig.out.shape):
                return kernel
        except MinicavsError:
            pass
    return BatchedKernel(sig, per_node=True)


class BatchedKernel:
    """The batching rule of a signature traced once: a list of op nodes over symbols whose
    per-row operands have the leading axis ``VERTICES``; ``run`` executes it for n rows.
    ``per_node``: the op itself on one row (a leading axis of 1), for an op with no batching
    rule for this signature."""

    def __init__(self, sig, per_node=False):
        self.per_node = per_node
        tracer = Tracer()
        with tracer.active():
            self.inputs = []  # per operand: its input symbol (None: a constant baked in)
            items = []
            for row, value in zip(sig.row_avals, sig.shared):
                if row is not None:
                    s = tracer.input((1 if per_node else VERTICES,) + tuple(row.shape),
                                     row.dtype)
                    items.append((s, "vertex"))
                elif hasattr(value, "requires_grad"):  # a Tensor: its value is read each run
                    s = tracer.input(tuple(value.shape), value.dtype)
                    items.append((s, None))
                else:
                    s = tracer.constant(np.asarray(value))
                    items.append((s, None))
                    s = None
                self.inputs.append(s)
            if per_node:
                args = [reshape(s, tuple(s.shape[1:])) if kind else s for s, kind in items]
                out = reshape(apply(sig.op, *args, **sig.attrs), (1,) + tuple(sig.out.shape))
            else:
                out = sig.op.batch(sig.op, items, sig.attrs, sig.out)
        if out.kind != "op":  # (an input or a constant passed through: an op writes it)
            with tracer.active():
                out = out + 0
        # (what ∂ needs of the signature, not the signature: it holds the parameters)
        self.row_avals, self.grad_enabled, self.op = sig.row_avals, sig.grad_enabled, sig.op
        self.shared_grads = sig.shared_grads()
        self.graph = Graph(tracer.nodes, [s for s in self.inputs if s is not None], [out],
                           name=f"{BATCH_OF} {sig.op.name!r}")  # (as debug mode names it)
        self.output = out
        self._exe = None
        self._backward = {}
        self.templates = {}  # (CuPy) its launches from C, per layout (launches.template)

    @property
    def exe(self):
        """The graph as a Program (``runtime.passes.compile_graph``: fusion), compiled on first
        use, keeping the values either form of its ∂ reads."""
        if self._exe is None:
            keep = {f.key: f for split in (False, True) for k in self.backward(split)
                    if k is not None for f, _ in k.refs}
            self._exe = Executable(compile_graph(self.graph, keep=keep.values()))
        return self._exe

    def backward(self, split_shared):
        """The backward kernels: ``(rows, shared)`` — ∂ for the per-row operands, run per
        batch, and ∂ for the shared operands, run per batch (``split_shared`` False: both
        in one graph, ``shared`` is None) or once over all batches of the signature (True:
        the backward-batching paper's strategy)."""
        if split_shared not in self._backward:
            self._backward[split_shared] = self.derive(split_shared)
        return self._backward[split_shared]

    def run(self, env, n, xp, out):
        """Evaluate into ``env`` (input symbol key -> array, filled by the caller) through the
        runtime's driver, the result into ``out`` (the batch's rows of its slab)."""
        driver.run_static(self.exe, env, xp, n, outs={self.output.key: out})
        return out

    def derive(self, split_shared):
        rows = [s for s, a in zip(self.inputs, self.row_avals)
                if a is not None and np.dtype(a.dtype).kind == "f"]
        shared = [self.inputs[i] for i in self.shared_grads]
        if not self.grad_enabled or self.op.vjp is None:
            rows, shared = [], []
        if split_shared and shared:
            readers = self._readers(shared) if rows else None
            if readers is None:
                return (BackwardKernel(self, rows) if rows else None), \
                    BackwardKernel(self, shared)
            # The rows' ∂ hands on the cotangents of the ops reading the shared operands; the
            # shared operands' ∂ starts from them, not again from the batch's cotangent —
            # where that saves work: the whole kernel's ∂ would recompute ops (lstm_step's
            # cell gradient), not only pass the cotangent through (linear's sum).
            whole = BackwardKernel(self, shared)
            tail = BackwardKernel(self, shared, graph=Graph(readers, [], readers))
            if not Counter(whole.op_names()) - Counter(tail.op_names()):
                return BackwardKernel(self, rows), whole
            rows_kernel = BackwardKernel(self, rows, also=readers)
            handed = rows_kernel.outputs[len(rows):]
            tail.same_as = [next(i for i, h in enumerate(handed) if h is o) for o in handed]
            return rows_kernel, tail
        wrt = rows + shared
        return (BackwardKernel(self, wrt) if wrt else None), None

    def _readers(self, shared):
        """The op nodes reading the shared operands, when their gradients are better derived
        from those nodes' cotangents: None where the only reader is the kernel's output (its
        cotangent is the batch's own) or one reader reads another (whose cotangent, already
        complete, would get that reader's term a second time)."""
        keys = {s.key for s in shared}
        readers = [n for n in self.graph.nodes if n.kind == "op" and any(
            x.key in keys for i, x in enumerate(n.inputs) if i not in n.op.nondiff_args)]
        if len(readers) == 1 and readers[0] is self.output:  # (Symbols compare by identity)
            return None
        reader_keys = {n.key for n in readers}
        if any(x.key in reader_keys for n in readers for x in n.inputs):
            return None
        return readers


class BackwardKernel:
    """∂ of a batched kernel (or of ``graph``, a part of it) with respect to some of its
    inputs. Inputs: the cotangents of the graph's outputs and the forward values its VJPs read
    (``refs``: forward symbols, looked up in the forward run's environment). Outputs: the
    gradients, then the cotangents of the ``also`` nodes (``grad_graph``). ``same_as`` (a
    kernel of reader nodes): per cotangent, the first one that is the same array."""

    def __init__(self, kernel, wrt, also=(), graph=None, same_as=None):
        self.graph = grad_graph(kernel.graph if graph is None else graph, wrt=wrt, also=also)
        self.cotangents = self.graph.cotangents
        self.refs = list(zip(self.graph.forward_refs,
                             self.graph.inputs[len(self.cotangents):]))
        self.wrt = [s.key for s in wrt]  # forward input symbols, in the order of outputs
        self.outputs = self.graph.outputs
        self.hands_on = len(also)  # trailing outputs: cotangents for the shared kernel
        # per handed cotangent, the op node that makes it (through views: the cell gradient
        # whose columns it is), or None: on the CPU each batch writes that node into its rows
        # of one block per signature, so the shared kernel reads them joined, as one view
        self.handed_made_by = [_made_by(o, self.graph) for o in self.outputs[len(wrt):]]
        self.same_as = same_as  # None: the one cotangent is the batch's
        self.exe = Executable(compile_graph(self.graph))
        self.templates = {}  # (CuPy) its launches from C, per layout (launches.py)
        # Refs with the vertex axis are rows of the batch; others (a parameter) are shared.
        self.ref_is_row = [row_domain(f.shape) is not None for f, _ in self.refs]

    def op_names(self):
        return [n.op.name for n in self.graph.nodes if n.kind == "op"]

    def run(self, cotangents, forward_env, n, xp, outs=None):
        """The gradients (and handed cotangents) of one batch of ``n`` rows; ``outs``: where
        values are written (symbol key -> array)."""
        env = {c.key: v for c, v in zip(self.cotangents, cotangents)}
        for f, s in self.refs:
            env[s.key] = forward_env[f.key]
        driver.run_static(self.exe, env, xp, n, outs)
        return [env[o.key] for o in self.outputs]


def _made_by(symbol, graph):
    """The op node of ``graph`` whose rows ``symbol`` views (column windows and reshapes of
    it, or itself), or None: an input, or a value no op of the graph makes."""
    made = {n.key for n in graph.nodes if n.kind == "op"}
    while symbol.kind == "op" and (symbol.op.keeps_rows or symbol.op.native == "window" and
                                   symbol.attrs["axis"] != 0):  # (row r of it is row r there)
        symbol = symbol.inputs[0]
    return symbol if symbol.kind == "op" and symbol.key in made else None
