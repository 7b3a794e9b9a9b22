"""The autobatch scope: recording eager ops as a lazy graph, and forcing it (docs/autobatch.md,
"How it works" 1–2).

Inside ``with mc.autobatch(strategy):`` every op on Tensors is handed to
:meth:`AutoBatch.record` (the hook in ``autodiff/tensor.py``), which returns a
:class:`LazyTensor`. Recording is the only per-node Python work: classify the operands (per-row
or shared), look the signature up in a dict, append the node's signature id, depth and per-row
sources to flat lists; the rest works on whole arrays (``schedule.py``, ``segment.py``). A
value that is needed runs every pending node as one *segment*; ``backward()`` runs the
segments in reverse, each batched as its forward was.
"""

import bisect
import time
import weakref

import numpy as np

from .. import backend
from ..autodiff import versions
from ..autodiff.tensor import Tensor, backward_seed, grad_lock, grad_mode, is_grad_enabled
from ..errors import ArgumentError, MinicavsError, UnsupportedError
from ..ops import registry
from ..ops.registry import Aval, tracers
from ..ops.shape import RESHAPE, SLICE_AXIS
from . import native, schedule
from .segment import Segment, add_param, device_clock
from .signature import Signature, drop_oldest
from .views import view_key

# Signatures learned in earlier scopes, by the fast path's key: a training loop opens a scope per
# mini-batch and meets the same call forms in each (the tagger: 74 a step, 3-4 ms to learn
# anew). Each is kept detached — no nodes, its parameters held weakly — and dropped when one of
# its parameters is collected (a key names parameters by id, which a new object may reuse).
_LEARNED = {}  # key -> (full key, detached Signature, the avals the key names, _forms(args))
_LEARNED_KEPT = 4096


class LazyTensor(Tensor):
    """A Tensor recorded inside an autobatch block: its shape and dtype are known at once, its
    value when the scope runs the pending graph (on first use of ``_array``)."""

    __slots__ = ("_scope", "_index", "_depth", "_aval", "_value")
    __minicavs_priority__ = 1.5  # ahead of Tensor, so a mixed call sees the lazy operand

    @property
    def _array(self):
        value = self._value
        if value is None:
            value = self._value = self._scope.value_of(self)
        return value

    @property
    def data(self):
        return self._array

    @data.setter
    def data(self, array):
        raise UnsupportedError("an autobatched value cannot be assigned to; make a new tensor")

    @property
    def shape(self):
        return self._aval.shape

    @property
    def dtype(self):
        return self._aval.dtype

    @property
    def is_leaf(self):
        return False

    @classmethod
    def __minicavs_apply__(cls, op, args, attrs):
        scope = registry.recording.scope if registry.recording_threads else None
        if scope is not None:
            return scope.record(op, args, attrs)
        grad = is_grad_enabled()  # (eager code after the block: its tape leads into it)
        for a in args:
            if isinstance(a, LazyTensor):
                a.read_eagerly(grad)
        return Tensor.__minicavs_apply__(op, args, attrs)

    def read_eagerly(self, grad):
        """Ready to be an operand of an eager op (its record saves its operands' versions);
        with ``grad``, an output of a record of its scope on the eager tape."""
        if self._versions is None:
            self._versions = versions.Version()
        if grad and self.requires_grad and self._creator is None:
            self._scope.hand_to_tape(self)

    def backward(self, grad=None, retain_graph=False, create_graph=False):
        """Batched reverse pass over the scope's recorded graph (see ``segment.py``)."""
        if create_graph:
            raise UnsupportedError("backward(create_graph=True) is not supported under "
                                   "autobatch; differentiate twice with eager tensors")
        grad = backward_seed(self, grad)  # (as eager backward() checks it)
        self._scope.backward([(self, None if grad is None else grad._array)], retain_graph)

    def __repr__(self):
        return "lazy " + super().__repr__()


_new_lazy = object.__new__  # (Tensor defines no __new__: a LazyTensor with its slots unset)


class LazyView(LazyTensor):
    """A slice of the last axis, or a reshape, of a pending node, recorded as a view of its
    rows instead of a node (``views.py``). ``_key``: its form (a ``ViewKey``); ``_index`` and
    ``_depth`` are the base node's."""

    __slots__ = ("_base", "_key")

    @property
    def _array(self):
        value = self._value
        if value is None:
            value = self._value = self._key.of_value(self._base._array)
        return value


class AutoBatch:
    """``with mc.autobatch(strategy) as ab:`` — record per-sample eager code, run it batched.

    ``strategy``: ``"agenda"`` (DyNet's), ``"depth"`` (TensorFlow Fold's), the same with
    ``"+"`` (``"agenda+"``, ``"depth+"``: parameter gradients of one signature gathered from
    all its forward batches into one product, the backward-batching paper's strategy), or
    ``"none"`` (every node its own batch, through the same machinery). ``ab.explain()`` says
    what was batched, how much was copied and where the time went.
    """

    def __init__(self, strategy="agenda+"):
        if strategy not in schedule.STRATEGIES:
            raise ArgumentError(f"mc.autobatch: unknown strategy {strategy!r}; choose one of "
                                f"{', '.join(schedule.STRATEGIES)}")
        self.strategy = strategy
        self.segments = []  # executed segments, in order
        self._starts = []  # first node index of each segment (for bisect)
        self._signatures = {}  # key -> Signature (a scope's; kernels are cached globally)
        self._known = {}  # the fast path's key -> (Signature, the avals its key names by id)
        self._fast_path = None  # record_known or its C twin, inside the block
        self._released = False
        self._tape_record, self._live_records = None, 0  # (eager code reading its values)
        self.backward_stats = []
        self._reset_pending(0)

    def _reset_pending(self, start):
        self.start = start  # index of the first pending node
        self.count = start  # index the next recorded node gets
        self.node_depth = []  # per pending node, its depth (1 + its deepest pending operand's)
        self.views = 0  # slices recorded as views (LazyView), not as nodes
        self.active = []  # signatures with nodes in the pending segment, by local id
        self.leaves, self._leaf_ids = [], {}
        # (recording time: from the block's start, or the last forcing, to the next forcing)
        self.record_began, self.record_device = time.perf_counter(), device_clock()

    # --- the block ------------------------------------------------------------------------------
    def __enter__(self):
        if registry.recording_threads and registry.recording.scope is not None:
            raise MinicavsError("mc.autobatch blocks cannot be nested; end the outer block first")
        # the C recorder (native.py), else the Python one; dropped on leaving (it holds the
        # scope: a cycle would keep the scope's slabs until the garbage collector ran)
        self._fast_path = native.recorder(self, (LazyTensor, LazyView)) or self.record_known
        registry.start_recording(self, self.record, self._fast_path)  # (this thread's ops)
        return self

    def grad_mode_changed(self, enabled):
        """This thread's grad mode changed while recording (``registry.grad_mode_changed``):
        the C recorder keys calls by it (the Python one reads it at each call)."""
        if self._fast_path is not None and hasattr(self._fast_path, "grad_enabled"):
            self._fast_path.grad_enabled = bool(enabled)

    def __exit__(self, exc_type, exc, tb):
        registry.stop_recording()
        self._fast_path = None
        if exc_type is None:
            self.run_pending()
        return False

    # --- recording (the hot path) -----------------------------------------------------------------
    def record(self, op, args, attrs):
        if op.multi_output:
            raise UnsupportedError(f"op '{op.name}' returns several values and cannot be "
                                   f"autobatched; call it outside the mc.autobatch block")
        if op.runs_whole:
            return self._run_whole(op, args, attrs)
        grad_on = is_grad_enabled()
        key, sources, depth, needs_grad = self._classify(args, -1)
        if not sources:
            if not needs_grad:  # data only: nothing to batch or differentiate, run it now
                return self._eager(op, args, attrs)
            # Only shared operands (``W.T``): treat the first as this node's own row.
            first = next(i for i, a in enumerate(args) if isinstance(a, Tensor))
            key, sources, depth, needs_grad = self._classify(args, first)
        try:
            full_key = (op, grad_on, tuple(attrs.items()), *key)
            sig = self._signatures.get(full_key)
        except TypeError:  # an unhashable attribute
            full_key = (op, grad_on, repr(attrs), *key)
            sig = self._signatures.get(full_key)
        if sig is None:
            sig = self._signature(full_key, op, args, attrs, grad_on, sources)
        self._last_signature, self._last_full_key = sig, full_key
        return self._append(sig, sources, depth, needs_grad)

    def _append(self, sig, sources, depth, needs_grad):
        """Record one node of ``sig`` and return its LazyTensor (made inline: this runs for
        every recorded op)."""
        index = self.count
        self.count = index + 1
        nodes = sig.nodes
        if not nodes:
            sig.local = len(self.active)
            self.active.append(sig)
        nodes.append(index)
        sig.arg_rows.extend(sources)
        depth += 1
        self.node_depth.append(depth)
        node = _new_lazy(LazyTensor)
        node._scope = self
        node._index = index
        node._depth = depth
        node._aval = sig.out
        node._value = node._versions = node._creator = node.grad = node.name = None
        node.requires_grad = needs_grad and sig.can_grad
        return node

    def record_known(self, op, args, attrs):
        """The fast path (``registry.set_fast_path``), taken before promotion: a call whose
        form — the op, its attributes, per operand a lazy value's aval or a parameter — was
        recorded before (with promotion leaving it unchanged) reuses that signature, skipping
        promotion, dispatch, shape inference and the signature's key. Anything else (data,
        scalars, symbols being traced): None, the usual way."""
        if tracers():
            return None
        if op is SLICE_AXIS or op is RESHAPE:
            view = self._view(op, args[0], attrs)
            if view is not None:
                return view
        parts, sources, depth, needs_grad = [op, grad_mode.enabled], [], 0, False
        start = self.start
        for a in args:
            kind = type(a)
            if kind is LazyTensor or kind is LazyView:  # (a view: keyed by its shape, tagged)
                parts.append(id(a._aval))  # (kept alive by the cache entry, or view_key)
                i = a._index
                if i >= start and a._scope is self:
                    sources.append(i if kind is LazyTensor else i + a._key.tag)
                    if a._depth > depth:
                        depth = a._depth
                else:
                    sources.append(self._leaf(a))
                if a.requires_grad:
                    needs_grad = True
            elif isinstance(a, Tensor) and a.requires_grad:  # a parameter, by identity
                parts.append(id(a))  # (its signature keeps it alive)
                needs_grad = True
            elif (type(a) is np.ndarray or type(a) is Tensor) and (a.ndim or _is_index(a)):
                # data (a word id, a label): a row of its own, keyed by shape and dtype as
                # _classify keys it
                parts.append((a.shape, a.dtype.str))
                sources.append(self._data_leaf(a))
            else:
                return None
        if not sources:
            return None
        if attrs:
            parts.append(tuple(attrs.items()))
        key = tuple(parts)
        try:
            known = self._known.get(key)
        except TypeError:  # an unhashable attribute
            return None
        if known is None:
            return self._learn(key, op, args, attrs)
        return self._append(known[0], sources, depth, needs_grad)

    def _learn(self, key, op, args, attrs):
        """A call form the fast path has not seen in this scope: its signature from an earlier
        scope (``_LEARNED``), or made by the usual way; either way known from now on."""
        learned = _LEARNED.get(key)
        if learned is not None and learned[3] == _forms(args):  # (a parameter may be resized)
            full_key, detached, avals, _ = learned
            sig = self._signatures.get(full_key) or detached.attached(len(self._signatures))
            if sig is not None:  # (None: one of its parameters is gone)
                self._signatures[full_key] = sig
                self._known[key] = (sig, avals)
                return self._fast_path(op, args, attrs)  # (known now: recorded at once)
        if op.multi_output or _promotes(op, args):
            return None  # (promotion would change the call: never cached)
        node = self.record(op, args, attrs)
        sig, avals = self._last_signature, [a._aval for a in args if type(a) is LazyTensor]
        if type(node) is not LazyTensor or sig.per_node:  # (run at once, or node by node)
            return node
        self._known[key] = (sig, avals)
        if len(_LEARNED) >= _LEARNED_KEPT:
            drop_oldest(_LEARNED)  # (the oldest form: a bounded cache)
        _LEARNED[key] = (self._last_full_key,
                         sig.detached(lambda _, key=key: _LEARNED.pop(key, None)), avals,
                         _forms(args))
        return node

    def _classify(self, args, force_row):
        """Per operand, its part of the signature key; the per-row sources (a pending node's
        index, or -1-j for leaf j); the depth; whether anything requires grad."""
        key, sources, depth, needs_grad = [], [], 0, False
        start = self.start
        for i, a in enumerate(args):
            kind = type(a)
            if kind is LazyTensor or kind is LazyView:  # (a view: its source is tagged)
                if a._scope is self and a._index >= start:
                    sources.append(a._index if kind is LazyTensor else a._index + a._key.tag)
                    if a._depth > depth:
                        depth = a._depth
                else:  # computed in an earlier segment or scope: data for this one
                    sources.append(self._leaf(a))
                key.append(a._aval)
                needs_grad = needs_grad or a.requires_grad
            elif isinstance(a, Tensor):
                if a.requires_grad and i != force_row:  # a parameter: shared by the batch
                    key.append(id(a))
                    needs_grad = True
                else:
                    sources.append(self._leaf(a) if a.requires_grad else self._data_leaf(a))
                    key.append(Aval(a.shape, a.dtype))
                    needs_grad = needs_grad or a.requires_grad
            elif getattr(a, "ndim", 1) == 0 and not _is_index(a):  # a constant, by its bytes
                key.append(("const", a.dtype.str, a.tobytes()))  # (-0.0 is not 0.0; NaN is NaN)
            else:  # an array of data
                sources.append(self._data_leaf(a))
                key.append(Aval(a.shape, a.dtype))
        return key, sources, depth, needs_grad

    def _view(self, op, x, attrs):
        """``slice_axis`` of the last axis, or ``reshape``, of a pending node of this block as
        a LazyView, or None (recorded as a node). A slice of a slice is one view; a view of a
        reshape is not (a node)."""
        base = x._base if type(x) is LazyView else x
        if type(base) is not LazyTensor or base._scope is not self or base._index < self.start:
            return None
        if op is RESHAPE:
            if base is not x:
                return None
            key = view_key(base._aval, shape=tuple(attrs["shape"]))
        else:
            if attrs["axis"] != len(x.shape) - 1 or (base is not x and not x._key.is_columns):
                return None
            offset = x._key.start if base is not x else 0
            key = view_key(base._aval, offset + attrs["start"], offset + attrs["stop"])
        view = _new_lazy(LazyView)
        view._scope = self
        view._index = base._index
        view._depth = base._depth
        view._base = base
        view._key = key
        view._aval = key.aval
        view._value = view._versions = view._creator = view.grad = view.name = None
        view.requires_grad = base.requires_grad
        self.views += 1
        return view

    def _leaf(self, value):
        """A value read as data whose content cannot change: an earlier segment's (read-only)
        or a Tensor that requires grad (minicavs' writers run the pending ops first:
        ``versions.writing``). Numbered once per object."""
        j = self._leaf_ids.get(id(value))
        if j is None:
            j = self._leaf_ids[id(value)] = len(self.leaves)
            self.leaves.append(value)  # (kept alive, so its id stays unique)
        return -1 - j

    def _data_leaf(self, value):
        """Data (an array, a Tensor that needs no gradient) is copied as it is recorded: the
        caller may write into it before the block runs (a reused buffer), and eager code
        would have read it now."""
        self.leaves.append((value._array if isinstance(value, Tensor) else value).copy())
        return -len(self.leaves)

    def _signature(self, full_key, op, args, attrs, grad_on, sources):
        row_avals, shared = [], []
        pending = iter(sources)
        for i, k in enumerate(full_key[3:]):
            if isinstance(k, Aval):
                row_avals.append(Aval(tuple(k.shape), np.dtype(k.dtype)))
                shared.append(None)
                next(pending)
            else:
                row_avals.append(None)
                shared.append(args[i])
        sig = Signature(len(self._signatures), op, attrs, row_avals, shared, grad_on)
        sig.can_grad = bool(grad_on and op.vjp is not None and np.dtype(sig.out.dtype).kind == "f")
        sig.local = -1
        if not sig.forward.per_node:  # (one that runs node by node is made for each node)
            self._signatures[full_key] = sig
        return sig

    def _run_whole(self, op, args, attrs):
        """An op that batches its own work (``Op.runs_whole``: a vertex function's call) runs at
        once, as eager code: its result is an eager Tensor, and the gradient the block's ops
        give it goes on through its own backward (``_continue_outside``). An operand of it
        computed in the block that needs a gradient is handed to the eager tape
        (:meth:`hand_to_tape`), so that backward leads back into the block's earlier segments
        (a second backward of them, seeded there); one without is read as data."""
        grad = is_grad_enabled()
        operands = []
        for a in args:
            if isinstance(a, LazyTensor):
                if grad and a.requires_grad:
                    a._array  # (run first: its record reads the segments that ran)
                    a.read_eagerly(grad)
                else:
                    a = Tensor(a._array)
            operands.append(a)
        return self._eager(op, tuple(operands), attrs)

    def _eager(self, op, args, attrs):
        state = registry.recording
        state.recorder = None
        registry.set_fast_path(None)
        try:
            return Tensor.__minicavs_apply__(op, args, attrs)
        finally:
            if state.scope is self:
                state.recorder = self.record
                registry.set_fast_path(self._fast_path)

    # --- forcing --------------------------------------------------------------------------------
    def run_pending(self):
        """Execute every pending node as one segment (batched by the strategy)."""
        if self.count == self.start:
            return
        start, active, node_depth, leaves = self.start, self.active, self.node_depth, self.leaves
        tensor_leaves = list(self._leaf_ids.values())
        segment = Segment(start, self.count, self.strategy)
        segment.stats["record_s"] = time.perf_counter() - self.record_began
        segment.stats["record_device_s"] = device_clock() - self.record_device
        segment.stats["views"] = self.views
        self._reset_pending(self.count)  # (first: nothing the run does finds these pending)
        try:
            segment.run(active, node_depth, leaves, tensor_leaves)
        except Exception as exc:  # its values raise this error; later ones run as usual
            segment = _Failed(exc)
            raise
        finally:
            for sig in active:
                sig.nodes, sig.arg_rows = [], []
            self.segments.append(segment)
            self._starts.append(start)

    def value_of(self, node):
        if node._index >= self.start:
            self.run_pending()
        segment = self.segments[bisect.bisect_right(self._starts, node._index) - 1]
        return segment.value_of(node._index)

    # --- reverse ------------------------------------------------------------------------------
    def backward(self, seeds, retain_graph=False):
        """Propagate ``seeds`` ((LazyTensor of this scope, gradient array or None) pairs)
        back through the segments, and on into leaves, parameters and other graphs."""
        _continue_outside(self._backward(seeds))
        if not retain_graph:  # (after the tapes outside: one may lead back into the scope)
            self._release()

    def hand_to_tape(self, value):
        """Make ``value`` an output of a record of the scope on the eager tape (see
        :class:`_TapeRecord`): eager code reads it, after the block or as the operand of an
        op that runs whole in it. A record's inputs are read once, when it is made: one made
        after a segment ran is a new one (which may read what the older one's outputs led to:
        two records, never a cycle)."""
        record = self._tape_record
        if record is None or record.segments_read != len(self.segments):
            record = self._tape_record = _TapeRecord(self)
            self._live_records += 1
        value._creator = (record, len(record.outputs))
        record.outputs.append(weakref.ref(value))

    def _release(self):
        self._released = True
        for segment in self.segments:
            segment.release()

    def _backward(self, seeds):
        """:meth:`backward` up to the values made outside the scope, without releasing it:
        their (value, gradient) pairs, for their own tapes or scopes. Seeds may come again
        (a tape that led out of the scope leading back into it, linear: the terms add up)."""
        self.run_pending()
        if self._released:
            raise MinicavsError(
                "backward() through an autobatched graph a second time: the first backward() "
                "released it. Sum the losses and call backward() once (or pass "
                "retain_graph=True to the first call)")
        began = time.perf_counter()
        last = max(bisect.bisect_right(self._starts, t._index) - 1 for t, _ in seeds)
        for segment in self.segments[:last + 1]:
            segment.begin_backward()
        for t, g in seeds:
            segment = self.segments[bisect.bisect_right(self._starts, t._index) - 1]
            segment.seed(t, g)
        params, outside = {}, []
        for segment in reversed(self.segments[:last + 1]):
            for value, g in segment.backward(params):
                self._route(value, g, params, outside)
        rows = [a for segment in self.segments for a in (*segment.slabs, *(segment.gslabs or ()))]
        for t, g in params.values():  # (shared operands: a parameter, or a tensor computed
            # from one outside the block — W * 2, W.T —, whose tape takes the gradient on)
            if t._creator is None:
                _accumulate_grad(t, g, rows)
            else:
                outside.append((t, g))
        self.backward_stats.append(time.perf_counter() - began)
        return outside

    def _route(self, value, g, params, outside):
        """A leaf's gradient: into an earlier segment, a parameter, or another graph."""
        if isinstance(value, LazyTensor):
            if value._scope is self:
                segment = self.segments[bisect.bisect_right(self._starts, value._index) - 1]
                segment.add_grad(value, g)
            elif value.requires_grad:
                outside.append((value, g))
        elif isinstance(value, Tensor) and value.requires_grad:
            if value._creator is None:
                add_param(params, value, g)
            else:
                outside.append((value, g))

    # --- reporting ------------------------------------------------------------------------------
    def explain(self, picture=True, max_batches=40):
        """What was batched and what it cost; see ``explain.py``."""
        from .explain import explain
        return explain(self, picture, max_batches)


class _TapeRecord:
    """The scope on the eager tape, as one op of many outputs: the values of the scope that
    eager code read (after the block, or a vertex function called in it:
    ``AutoBatch.hand_to_tape``). Its inputs are what the scope's segments that ran by then read
    that has a tape of its own (a tensor computed from a parameter before the block, another
    scope's values, a vertex function's output), so the eager backward reaches this record
    before theirs and one batched backward of the scope, seeded with every output's gradient,
    hands theirs on in the same pass; parameters get theirs from the scope directly. Seen from
    the tape, it is a record (``autodiff/tensor._Record``) whose op is itself."""

    multi_output, nondiff_args, name = True, (), "mc.autobatch block"

    def __init__(self, scope):
        # (the scope weakly: it holds this record, and a cycle would keep its slabs until the
        # garbage collector ran; the outputs hold it while a backward can reach this record)
        self._scope = weakref.ref(scope)
        self.op, self.attrs, self.outputs, self.where = self, {}, [], None
        inputs = {}
        for segment in scope.segments:
            for t in _read_with_a_tape(segment, scope):
                inputs.setdefault(id(t), t)
        self.inputs, self.segments_read = list(inputs.values()), len(scope.segments)

    def check_saved(self, outs):  # (the segments check what they read: begin_backward)
        pass

    def vjp(self, out_grads, outs, *inputs):
        if is_grad_enabled():  # (backward(create_graph=True): the scope records no ∂ of ∂)
            raise UnsupportedError("backward(create_graph=True) through the values of an "
                                   "mc.autobatch block is not supported; differentiate twice "
                                   "with eager tensors")
        seeds = [(o, g._array) for o, g in zip(outs, out_grads) if o is not None and
                 g is not None]  # (one at least: the tape reached this record through it)
        grads, rest = {id(x): None for x in inputs}, []
        for value, g in seeds[0][0]._scope._backward(seeds):  # (a live output holds it)
            if id(value) in grads:  # (a tensor's terms added, as one input's)
                g, found = g.reshape(value.shape), grads[id(value)]
                grads[id(value)] = g if found is None else found + g
            else:
                rest.append((value, g))
        _continue_outside(rest)
        return [None if grads[id(x)] is None else Tensor(grads[id(x)]) for x in inputs]

    def release(self):
        """The eager backward released its graph: so is the scope's, with its last record."""
        scope = self._scope()
        if scope is not None:
            scope._live_records -= 1
            if scope._live_records == 0:
                scope._release()


def _read_with_a_tape(segment, scope):
    """The tensors ``segment`` read that carry a gradient on through a tape of their own
    (another scope's values handed to the tape first)."""
    found = [t for t, _, _ in getattr(segment, "read", ())
             if t.requires_grad and t._creator is not None]
    for j in getattr(segment, "tensor_leaves", ()):
        v = segment.leaves[j]
        if isinstance(v, LazyTensor) and v._scope is not scope and v.requires_grad:
            if v._creator is None:
                v._scope.hand_to_tape(v)
            found.append(v)
    return found


class _Failed:
    """A segment whose run raised: reading one of its values raises a clear error (the values
    recorded after it run as usual)."""

    def __init__(self, exc):
        self.error = f"{type(exc).__name__}: {exc}"
        self.slabs, self.gslabs = [], None

    def value_of(self, index):
        raise MinicavsError("this value was recorded in a part of the autobatch block whose run "
                            "failed with the error raised then:\n" + self.error)

    def begin_backward(self):  # (nothing later can depend on its values: no value exists)
        pass

    def backward(self, params):
        return []

    release = begin_backward


def _forms(args):
    """The shapes and dtypes of a call's Tensor operands that its fast-path key names by
    identity (parameters): one resized or recast between two scopes is a new form."""
    return tuple((tuple(a.shape), a.dtype) for a in args
                 if isinstance(a, Tensor) and not isinstance(a, LazyTensor))


def _is_index(a):
    """A NumPy integer scalar array — a label, an id — is data, a row of its own, so nodes
    differing in it batch together (the 16 tags of a tagger were 16 batches of its loss); a
    float or Python scalar is a constant of the signature."""
    return type(a) is np.ndarray and a.dtype.kind in "iu"


def _promotes(op, args):
    """Whether ``registry.promote`` would change these Tensor operands (without calling it:
    a cast it made would be recorded)."""
    positions = range(len(args)) if op.promotes == "all" else op.promotes
    dtypes = {np.dtype(args[i].dtype) for i in positions}
    return len(dtypes) > 1 or (op.promotes_to_float and any(d.kind != "f" for d in dtypes))


def _accumulate_grad(t, g, rows):
    """``t.grad`` += ``g``. A gradient that may be a view of the scope's row memory (``rows``,
    its slabs: a view would tie ``.grad`` to the scope's buffers and keep a whole slab alive)
    is copied; any other is handed over as it is — a parameter's gradient is made fresh by its
    product or scatter-add, and copying an embedding table's (18 MB at the Tree-LSTM's
    vocabulary) cost more than the rest of the step's backward pass."""
    g = g.reshape(t.shape)
    with grad_lock:  # (another thread's backward may add into the same parameter)
        if t.grad is not None:
            t.grad = Tensor(t.grad._array + g)
            return
        xp = backend.get_array_module(g)
        shares = getattr(xp, "may_share_memory", None)
        if shares is None or any(shares(g, r) for r in rows):
            g = g.copy()
        t.grad = Tensor(g)


def _continue_outside(outside):
    """Gradients reaching values made outside this graph: another autobatch scope's values
    (its own batched backward) or eager tensors with a tape (their eager backward)."""
    by_scope, eager = {}, {}
    for value, g in outside:
        if isinstance(value, LazyTensor):
            by_scope.setdefault(id(value._scope), (value._scope, []))[1].append((value, g))
        else:  # (one backward per tensor: its terms, as a shared and a per-row operand, added)
            g = g.reshape(value.shape)
            found = eager.get(id(value))
            eager[id(value)] = (value, g if found is None else found[1] + g)
    for value, g in eager.values():
        value.backward(Tensor(g), retain_graph=True)
    for scope, seeds in by_scope.values():
        scope.backward(seeds)


def autobatch(strategy="agenda+"):
    """Batch plain per-sample eager code automatically (see :class:`AutoBatch`)."""
    return AutoBatch(strategy)
