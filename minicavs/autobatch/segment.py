"""One forced execution of a scope's pending nodes: layout, batched forward, batched backward
(docs/autobatch.md, "How it works" 4–7, explains each, and the ``+`` strategies).

Every value of one per-row shape and dtype lives in one *slab*, a row per value: the segment's
leaves, then the nodes, a batch one contiguous block. A batch whose operand rows are one run of
a slab reads a view, otherwise one ``take`` gathers them (``explain()`` counts both); backward,
its operands' gradients are added into their rows of gradient slabs (``+=`` on a view, else a
scatter-add). Under ``+`` the cotangents and saved operands of every batch of a signature are
joined into one block each, and a shared operand's gradient is one product.

Host cost: row indices are planned for the whole segment and moved to the device in one copy
(``_Indices``); a batch is laid out in the order its first reader reads it
(``schedule.in_reader_order``), so many reads are views; on a GPU the batches' launches are
issued from C where their ops allow (``launches.py``), forward and backward.
``stats["host_us_per_node"]`` is the time per node not spent in kernels — recording,
scheduling, launch preparation — which on a GPU decides whether the device waits for Python.
"""

import contextlib
import sys
import time
from collections import defaultdict

import numpy as np

from .. import backend
from ..autodiff import versions
from ..autodiff.tensor import Tensor
from ..cpu import kernels, products
from ..cuda import kernels as cuda_kernels
from ..errors import MinicavsError
from ..locations import format_location
from ..runtime.memory import SLABS
from . import launches, native, schedule, views


class _Batch:
    # (handed: the cotangents its rows' ∂ passed to the shared one; sig_row: its first row
    # among its signature's, launches.py)
    __slots__ = ("sig", "n", "inputs", "shared", "out_slab", "out_row", "env", "targets",
                 "handed", "sig_row")


class Segment:
    def __init__(self, start, stop, strategy):
        self.start, self.stop, self.strategy = start, stop, strategy
        self.plus = strategy.endswith("+")
        self.stats = {"nodes": stop - start, "copies_made": 0, "copies_avoided": 0,
                      "scatter_made": 0, "scatter_avoided": 0, "plus_copies": 0,
                      "plus_copies_avoided": 0, "plus_products": 0, "plus_products_saved": 0,
                      "backward_s": 0.0,
                      "kernel_s": 0.0, "by_signature": defaultdict(lambda: [0, 0])}
        self.gslabs = self.from_c = None

    # --- scheduling and layout ------------------------------------------------------------------
    def run(self, active, node_depth, leaves, tensor_leaves):
        """Lay out, plan and run the forward pass. ``leaves``: the values read as data, arrays
        (copied as recorded) except at ``tensor_leaves`` (their positions): Tensors."""
        began, device_began = time.perf_counter(), device_clock()
        start, n = self.start, self.stop - self.start
        depth = np.asarray(node_depth, dtype=np.int64)
        # Every signature's nodes and operand sources as one array each (converted from the
        # recorder's lists in one go, not per signature), then each signature's table a view.
        counts = [len(sig.nodes) for sig in active]
        nodes = native.int64s([sig.nodes for sig in active], n) - start
        raw = native.int64s([sig.arg_rows for sig in active])
        sig_of = np.empty(n, dtype=np.int64)  # a node's signature (its local id: in active)
        sig_of[nodes] = np.repeat(np.arange(len(active)), counts)
        position = np.empty(n, dtype=np.int64)  # a node's row in its signature's table
        position[nodes] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
        pending = raw >= 0
        # A source read through a view has the view's code in its high bits (views.py).
        codes = np.where(pending, raw >> views.SHIFT, 0)
        # Value ids: a pending node's local index, or n + j for leaf j.
        values = np.where(pending, (raw & views.INDEX) - start, n - 1 - raw)
        reader = np.repeat(nodes, np.repeat([sig.arity for sig in active], counts))
        src, dst = values[pending], reader[pending]
        tables, at = [], 0
        for sig, count in zip(active, counts):
            size = count * sig.arity
            tables.append((values[at:at + size].reshape(count, sig.arity),
                           codes[at:at + size].reshape(count, sig.arity)))
            at += size
        batches = schedule.plan(self.strategy, sig_of, depth, src, dst, len(active))

        # Slabs: one per (per-row shape, dtype); leaves first, then nodes in execution order.
        slab_ids = {}

        def slab_of(aval):
            key = (tuple(aval.shape), np.dtype(aval.dtype))
            return slab_ids.setdefault(key, len(slab_ids))

        # Leaves (thousands of word ids and labels) first, each in the slab of the operand
        # form that reads it (its signature's row aval): no Python per leaf; in the order
        # their first readers read them (as the nodes: schedule.in_reader_order).
        arrays = list(leaves)
        for j in tensor_leaves:
            arrays[j] = leaves[j]._array
        leaf_slab = np.full(len(leaves), -1, dtype=np.int64)
        read_as = np.concatenate([np.tile([slab_of(a) for a in sig.row_avals if a is not None],
                                          count) for sig, count in zip(active, counts)])
        leaf_of = values[~pending] - n
        leaf_slab[leaf_of] = read_as[~pending]
        at = np.empty(n, dtype=np.int64)  # a node's position in execution order
        at[np.concatenate(batches)] = np.arange(n)
        first_read = np.full(len(leaves), n, dtype=np.int64)
        np.minimum.at(first_read, leaf_of, at[reader[~pending]])
        for j in np.flatnonzero(leaf_slab < 0).tolist():  # (recorded by a call that failed)
            leaf_slab[j] = slab_of(arrays[j])
        out_slab = np.array([slab_of(sig.out) for sig in active], dtype=np.int64)
        num_slabs = len(slab_ids)
        leaf_row, leaf_count = _ranks(leaf_slab, num_slabs, first_read)
        by_slab = np.lexsort((first_read, leaf_slab))
        members = [[arrays[j] for j in part.tolist()] for part in  # each slab's leaves
                   np.split(by_slab, np.cumsum(leaf_count)[:-1])]
        # Within a slab, the nodes of one signature together, in execution order: a batch
        # is still one block, and all batches of a signature are one run of rows, so the
        # '+' strategy reads their outputs' gradients (and operands they read in one piece)
        # as one view instead of copying them together.
        order = np.concatenate(batches)
        order = order[np.argsort(sig_of[order], kind="stable")]
        node_slab = out_slab[sig_of]
        node_rank, node_count = _ranks(node_slab[order], num_slabs)
        row_of = np.empty(n, dtype=np.int64)
        row_of[order] = leaf_count[node_slab[order]] + node_rank
        self.node_slab, self.row_of = node_slab, row_of
        self.leaves, self.leaf_slab, self.leaf_row = leaves, leaf_slab, leaf_row
        self.tensor_leaves = tensor_leaves
        lookup = np.concatenate([row_of, leaf_row])  # value id -> its row in its slab
        value_slab = np.concatenate([node_slab, leaf_slab])  # value id -> its slab

        # CuPy when the data or the parameters are there (a word id stays a NumPy leaf, moved
        # with the others into the slab)
        on_device = [v for v in set(map(type, arrays)) if v is not np.ndarray] and [
            v for v in arrays if type(v) is not np.ndarray and backend.is_cupy_array(v)]
        on_device += [
            s._array for sig in active for s in sig.shared
            if isinstance(s, Tensor) and backend.is_cupy_array(s._array)]
        xp = backend.get_array_module(on_device[0]) if on_device else np
        self.xp = xp
        self.counter = getattr(xp, "launch_counter", None)  # (the emulated device counts launches)
        uploads = self.counter.uploads if self.counter is not None else 0
        read = {}  # the Tensors it reads (by object), with an op and the argument reading each
        for sig in active:
            for i, t in enumerate(sig.shared):
                if isinstance(t, Tensor):
                    read.setdefault(id(t), (t, sig.op.name, sig.op.argument_name(i)))
        self.invariants = [t._array for t, _, _ in read.values()]
        for j in tensor_leaves:
            v = leaves[j]
            if v.requires_grad and not hasattr(v, "_scope"):
                read.setdefault(id(v), (v, "autobatched", "a value"))
        # Their versions, as an eager record saves them: backward refuses one changed since.
        self.read = list(read.values())
        self.saved = versions.save([t for t, _, _ in self.read])
        shapes = {v: k for k, v in slab_ids.items()}
        self.slabs = SLABS.arrays(xp, [((int(leaf_count[i] + node_count[i]),) + shapes[i][0],
                                         shapes[i][1]) for i in range(num_slabs)])
        for slab, values in zip(self.slabs, members):
            if not values:
                continue
            # (np.array of a list of arrays of one shape stacks them, 10x np.stack; on a GPU
            # the host's data — word ids, labels — goes over in one copy, not one per leaf)
            if xp is np or set(map(type, values)) == {np.ndarray}:
                # (0-d ones, word ids, are read 3x faster by fromiter)
                host = np.fromiter(values, slab.dtype, len(values)) if slab.ndim == 1 else \
                    np.array(values)
                slab[:len(values)] = xp.asarray(host)
            else:
                slab[:len(values)] = xp.stack([xp.asarray(v) for v in values])
        self.plan = self._plan_batches(batches, active, sig_of, tables, position, lookup,
                                       value_slab, out_slab, row_of)
        self.stats["batches"] = len(batches)
        self.stats["schedule_s"] = time.perf_counter() - began
        # (the slabs' fill and the plan's index uploads are the device's work, not the host's)
        if self.counter is not None:
            self.stats["kernel_s"] += device_clock() - device_began
        with self._one_pool():
            self._forward()
        if self.counter is not None:
            self.stats["uploads"] = self.counter.uploads - uploads
        self._host_time()

    def _plan_batches(self, batches, active, sig_of, tables, position, lookup, value_slab,
                      out_slab, row_of):
        """Each batch's operands: per per-row operand, (symbol id, slab, first row, rows or
        None where they are one contiguous run, whether the rows are distinct, view or None);
        an operand whose rows lie in several slabs or forms (some read through views) has
        slab None and, in place of the rows, its groups (slab, view, positions, rows,
        distinct) — gathered into one array. Rows and positions are on the segment's device,
        all moved there in one copy (``_Indices``). Worked out with array operations per signature
        over all its batches at once (an LSTM step's signature has one batch per time step),
        then a few list look-ups per batch."""
        plan = [None] * len(batches)
        indices = _Indices()
        by_sig = defaultdict(list)  # signature -> positions of its batches in the plan
        first_nodes = np.array([int(nodes[0]) for nodes in batches], dtype=np.int64)
        for i, s in enumerate(sig_of[first_nodes].tolist()):
            by_sig[s].append(i)
        for s, positions in by_sig.items():
            sig = active[s]
            parts = [batches[i] for i in positions]
            sizes = np.array([len(p) for p in parts], dtype=np.int64)
            hi = np.cumsum(sizes)
            lo = hi - sizes
            table, codes = tables[s]
            at = position[np.concatenate(parts)] if len(parts) > 1 else position[parts[0]]
            values = table[at]
            rows = lookup[values]  # (nodes, per-row operands): rows in their slabs
            slabs, codes = value_slab[values], codes[at]
            # Per batch and operand: rows one run (each next row one further), and every row
            # in the first's slab and form; counted over the batch's rows with cumulative sums
            steps = np.zeros((len(rows),) + rows.shape[1:], dtype=np.int64)
            steps[1:] = np.cumsum((rows[1:] - rows[:-1]) != 1, axis=0)
            contiguous = (steps[hi - 1] - steps[lo] == 0).tolist()
            first_slab, first_code = slabs[lo], codes[lo]
            other = (slabs != np.repeat(first_slab, sizes, axis=0)) | (
                codes != np.repeat(first_code, sizes, axis=0))
            others = np.zeros((len(rows) + 1,) + rows.shape[1:], dtype=np.int64)
            others[1:] = np.cumsum(other, axis=0)
            uniform = (others[hi] - others[lo] == 0).tolist()
            first_slab, first_code = first_slab.tolist(), first_code.tolist()
            first_row = rows[lo].tolist()
            repeats = _repeats(rows, sizes)
            by_operand = None  # the signature's rows operand by operand, in the index buffer
            kernel, label, out = sig.forward, sig.label, int(out_slab[s])
            operands = list(zip(kernel.inputs, sig.row_avals, sig.shared))
            counts = self.stats["by_signature"][label]
            for j, i in enumerate(positions):
                b = _Batch()
                b.sig, b.n = sig, int(sizes[j])
                a, z = int(lo[j]), int(hi[j])
                b.inputs, b.shared, b.targets = [], [], {}
                k = 0
                for symbol, aval, shared in operands:
                    if aval is not None:
                        if uniform[j][k]:
                            whole = contiguous[j][k]
                            if not whole and by_operand is None:
                                by_operand = indices.add(rows.T.ravel()).start
                            at = by_operand + k * len(rows) if not whole else 0
                            entry = (symbol.key, first_slab[j][k], first_row[j][k],
                                     None if whole else slice(at + a, at + z),
                                     not repeats[j, k], views.BY_CODE[first_code[j][k]])
                            self.stats["copies_avoided" if whole else "copies_made"] += 1
                        else:
                            entry = (symbol.key, None, 0, _groups(
                                slabs[a:z, k], codes[a:z, k], rows[a:z, k], indices), False,
                                None)
                            self.stats["copies_made"] += 1
                        b.inputs.append(entry)
                        b.targets[symbol.key] = entry
                        k += 1
                    elif symbol is not None:
                        b.shared.append((symbol.key, shared))
                        b.targets[symbol.key] = shared
                b.out_slab, b.out_row = out, int(row_of[batches[i][0]])
                b.env = b.handed = None
                counts[0] += 1
                counts[1] += b.n
                plan[i] = b
        indices.resolve(plan, self.xp)
        return plan

    # --- forward --------------------------------------------------------------------------------
    def _forward(self):
        began, device_began = time.perf_counter(), self._device_seconds()
        slabs, xp, counter = self.slabs, self.xp, self.counter
        before = counter.snapshot() if counter is not None else None
        by_signature = {}
        self.from_c = from_c = launches.issuer_for(self)  # (CuPy: batches from C, where)
        for b in self.plan:
            if from_c is not None:
                made = from_c.queue(b)
                if made is not None:  # (one launch an operation)
                    by_signature[b.sig.label] = by_signature.get(b.sig.label, 0) + \
                        len(made.names)
                    continue
                from_c.flush()
            last = counter.total if counter is not None else 0
            n = b.n
            env = {}
            for symbol, slab, lo, rows, _, view in b.inputs:
                if slab is None:  # rows in several slabs or forms: gathered group by group
                    env[symbol] = _gather_groups(xp, slabs, rows, n)
                    continue
                a = slabs[slab] if view is None else view.of(slabs[slab])
                env[symbol] = a[lo:lo + n] if rows is None else a[rows]
            for symbol, t in b.shared:
                env[symbol] = t._array
            try:
                self._timed(b.sig.forward.run, env, n, xp,
                            slabs[b.out_slab][b.out_row:b.out_row + n])
            except MinicavsError as exc:  # (bad data found as the batch runs: say which)
                raise type(exc)(f"{exc}\n  in an mc.autobatch batch of {n} call"
                                f"{'s' if n != 1 else ''} of op '{b.sig.op.name}' (a position "
                                f"above counts its calls), made like the one"
                                f"{format_location(b.sig.where) or ' at an unknown line'}"
                                ) from None
            if b.sig.can_grad:
                b.env = env  # what its backward reads
            if counter is not None:  # (the batch's operand gathers included)
                by_signature[b.sig.label] = by_signature.get(b.sig.label, 0) + \
                    counter.total - last
        if from_c is not None:
            from_c.flush()
            self.stats["batches_from_c"] = from_c.forward
            self.stats["why_not_from_c"] = from_c.why
        self.stats["forward_s"] = time.perf_counter() - began
        self.stats["kernel_s"] += self._device_seconds() - device_began
        if counter is not None:
            self.stats["forward_launches"] = sum(counter.since(before).values())
            self.stats["forward_launches_by_signature"] = by_signature

    def value_of(self, index):
        """A node's value: a read-only view of its row (a write would change what the
        backward pass reads)."""
        local = index - self.start
        value = self.slabs[self.node_slab[local]][self.row_of[local], ...]
        if self.xp is np:
            value.flags.writeable = False
        return value

    # --- backward -------------------------------------------------------------------------------
    def begin_backward(self):
        for i, (t, op_name, role) in enumerate(self.read):
            versions.check([t], (self.saved[0][i:i + 1],
                                 self.saved[1] and self.saved[1][i:i + 1]), op_name,
                           roles=[role])
        # Fresh zeros for every backward pass: a second one (retain_graph) must not start from
        # the first one's cotangents.
        self.gslabs = SLABS.arrays(self.xp, [(s.shape, s.dtype) for s in self.slabs],
                                    zero=True)

    def seed(self, value, grad):
        """Add ``grad`` (None: 1) to the gradient of ``value``, a LazyTensor of this segment
        (a view's into the base's row, through the view)."""
        local = value._index - self.start
        gslab, row = self.gslabs[self.node_slab[local]], self.row_of[local]
        view = getattr(value, "_key", None)
        if view is not None:
            gslab = view.of(gslab)
        gslab[row] += 1 if grad is None else grad

    add_grad = seed

    def backward(self, params):
        """Run the batches in reverse; return (leaf, gradient) for the leaves that need one."""
        began, device_began = time.perf_counter(), self._device_seconds()
        gslabs, xp, stats, counter = self.gslabs, self.xp, self.stats, self.counter
        deferred = defaultdict(list)  # signature -> [(cotangent, env, n)] (the + strategies)
        before = counter.snapshot() if counter is not None else None
        uploads = counter.uploads if counter is not None else 0
        with self._one_pool():
            self._backward_batches(gslabs, xp, deferred, params)
            for sig, terms in deferred.items():
                self._shared_gradients(sig, terms, params)
        if self.from_c is not None:
            stats["shared_gradients_from_c"] = self.from_c.shared
        stats["backward_s"] += time.perf_counter() - began
        stats["kernel_s"] += self._device_seconds() - device_began
        if counter is not None:
            stats["backward_launches"] = (stats.get("backward_launches", 0)
                                          + sum(counter.since(before).values()))
            stats["uploads"] += counter.uploads - uploads
        self._host_time()
        return [(self.leaves[j], gslabs[self.leaf_slab[j]][self.leaf_row[j]])
                for j in self.tensor_leaves if self.leaves[j].requires_grad]

    def _backward_batches(self, gslabs, xp, deferred, params):
        """Each batch's ∂, in reverse; under '+' its shared operands' terms wait in
        ``deferred`` for one product per signature."""
        from_c = self.from_c
        blocks = self._handed_blocks() if self.plus and from_c is None and xp is np else {}
        for b in reversed(self.plan):
            if b.env is None:
                continue
            rows_kernel, shared_kernel = b.sig.forward.backward(self.plus)
            n = b.n
            cotangent = gslabs[b.out_slab][b.out_row:b.out_row + n]
            if rows_kernel is not None and from_c is not None and \
                    from_c.queue_backward(b, rows_kernel, cotangent, gslabs):
                rows_kernel = None  # (queued: its gradients are added from C)
            elif from_c is not None:
                from_c.flush()
            if rows_kernel is not None:
                outs = None
                if rows_kernel.hands_on and b.sig in blocks:  # (into its rows of the block)
                    outs = {m.key: blocks[b.sig][m.key][b.sig_row:b.sig_row + n]
                            for m in rows_kernel.handed_made_by if m is not None}
                grads = self._timed(rows_kernel.run, (cotangent,), b.env, n, xp, outs)
                if rows_kernel.hands_on:
                    b.handed = grads[len(rows_kernel.wrt):]
                for symbol, g in zip(rows_kernel.wrt, grads):
                    target = b.targets[symbol]
                    if isinstance(target, tuple):
                        self._scatter(gslabs, target, g, n)
                    else:
                        add_param(params, target, g)
            if shared_kernel is not None:
                deferred[b.sig].append(b)
        if from_c is not None:
            from_c.flush()
            self.stats["backward_batches_from_c"] = from_c.backward

    def _handed_blocks(self):
        """(NumPy, '+' strategies) Per signature whose rows' ∂ hands cotangents on to its
        shared operands' one product, a block for each value they are views of (the cell's
        gradient: its gate columns are handed on), a row per row of the signature's batches
        in plan order (``b.sig_row``): each batch's ∂ writes its rows there, so the product
        reads them all as one view (``_joined``) instead of a copy of them (4 MB a step of
        the tagger, read cold: 4 ms of 68)."""
        rows, blocks = {}, {}
        for b in self.plan:
            if b.env is None:
                continue
            b.sig_row = rows.get(b.sig, 0)
            rows[b.sig] = b.sig_row + b.n
        for sig, total in rows.items():
            rows_kernel, shared_kernel = sig.forward.backward(True)
            if rows_kernel is None or shared_kernel is None or not rows_kernel.hands_on:
                continue
            made = [m for m in rows_kernel.handed_made_by if m is not None]
            if made:
                blocks[sig] = {m.key: np.empty((total,) + tuple(m.shape[1:]), m.dtype)
                               for m in made}
        return blocks

    # --- host time ------------------------------------------------------------------------------
    def _timed(self, run, *args):
        """``run(*args)``, a batched kernel: on NumPy its time is the kernels' (its arithmetic
        cannot be told apart from the runtime's dispatch); a device's is measured by the
        device (``_device_seconds``)."""
        if self.xp is not np:
            return run(*args)
        began = time.perf_counter()
        out = run(*args)
        self.stats["kernel_s"] += time.perf_counter() - began
        return out

    def _device_seconds(self):
        """The emulated device's time: everything inside its stand-in library (the kernels,
        products and ufuncs, and the stand-ins' own bookkeeping, which on a GPU is CuPy's and
        the driver's), as the level loops' host time leaves it out; 0 for NumPy (timed by
        ``_timed``) and a GPU (its kernels run asynchronously, outside the host's time, except
        where the host waits for a result)."""
        return device_clock() if self.counter is not None else 0.0

    def _host_time(self):
        """Recording, scheduling, and everything of the forward and backward passes but the
        kernels' own time — launch preparation — per node, in µs: the cost that decides
        whether a GPU waits for Python."""
        st = self.stats
        host = st.get("record_s", 0.0) - st.get("record_device_s", 0.0) + st["schedule_s"] + \
            st["forward_s"] + st["backward_s"] - st["kernel_s"]
        st["host_us_per_node"] = max(host, 0.0) * 1e6 / max(st["nodes"], 1)

    @contextlib.contextmanager
    def _one_pool(self):
        """The batches' large products on the native team, the small ones on one BLAS thread
        (``cpu/products.team_products``), as in a call of native loops: OpenBLAS's own pool
        on a busy machine waits at its barriers for a thread that is not running (measured,
        tagger, 2 threads, both cores busy with other work: 3.6 s a step against 0.125 s).
        The shared operands do not change while the batches run: a recurrent step's product
        with few rows reads its weight packed once (``products.invariant_operands``)."""
        native = self.xp is np and products.team_ready()
        with products.team_products(native), \
                products.invariant_operands(self.invariants if native else ()):
            yield

    def _scatter(self, gslabs, target, g, n):
        _, slab, lo, rows, distinct, view = target
        if slab is None:  # group by group
            for slab, view, positions, rows, distinct in rows:
                self._scatter(gslabs, (None, slab, 0, rows, distinct, view), g[positions],
                              len(positions))
            return
        gslab = gslabs[slab] if view is None else view.of(gslabs[slab])
        if rows is None:
            block = gslab[lo:lo + n]
            block += g  # (in place: ``gslab[lo:lo + n] += g`` would copy the sum back too)
            self.stats["scatter_avoided"] += 1
            return
        self.stats["scatter_made"] += 1
        if self.xp is not np:  # one launch, atomic adds: a row read twice gets both terms
            if gslab.flags.c_contiguous and g.flags.c_contiguous and g.dtype == gslab.dtype:
                cuda_kernels.scatter_add_rows(g, rows, gslab, check_indices=False)
            else:  # (a view of some columns)
                self.xp.add.at(gslab, rows, g)
        elif kernels.scatter_add_rows(gslab, rows, g):
            return  # (native: one pass over the rows; a row read twice gets both terms)
        elif distinct:
            gslab[rows] += g  # (a gather, an add and a scatter: three passes)
        else:  # a value read twice by one batch: add each row's terms
            np.add.at(gslab, rows, g)

    def _shared_gradients(self, sig, terms, params):
        """The backward-batching strategy: one product for the shared operands' gradients of
        every forward batch of ``sig``, over their rows copied into one block."""
        _, kernel = sig.forward.backward(True)
        terms = terms[::-1]  # forward order: their rows ascend
        total = sum(b.n for b in terms)
        if kernel.same_as is None:  # the batches' own cotangents: often one run of rows
            cotangents = [self._joined(self.gslabs,
                                       [(b.out_slab, b.out_row, b.n) for b in terms], None)]
        else:  # those the rows' ∂ handed on (one array for several readers, joined once)
            joined = {}
            for j in kernel.same_as:
                if j in joined:
                    continue
                joined[j] = terms[0].handed[j] if len(terms) == 1 else self._joined_from_c(
                    terms, lambda b, j=j: b.handed.where(j) if hasattr(b.handed, "where")
                    else None)
                if joined[j] is None:
                    joined[j] = self._joined(None, None, [b.handed[j] for b in terms])
            cotangents = [joined[j] for j in kernel.same_as]
            for b in terms:
                b.handed = None
        env = {}
        for (f, _), is_row in zip(kernel.refs, kernel.ref_is_row):
            if not is_row or len(terms) == 1:
                env[f.key] = terms[0].env[f.key]
                continue
            spans = [b.targets.get(f.key) for b in terms]  # (an operand read as a view)
            view = None
            if any(not isinstance(t, tuple) or t[3] is not None or t[5] is not spans[0][5]
                   for t in spans):  # (one form of view for all, or the values are joined)
                spans = None
            else:
                view = spans[0][5]
                spans = [(t[1], t[2], b.n) for t, b in zip(spans, terms)]
            env[f.key] = self._joined_from_c(terms, lambda b, key=f.key: _made_from_c(
                b.env, key)) if spans is None else None
            if env[f.key] is None:
                env[f.key] = self._joined(self.slabs, spans, [b.env[f.key] for b in terms],
                                          view)
        grads = self.from_c and self.from_c.queue_shared(sig, kernel, cotangents, env, total)
        if grads:  # (issued now: the gradients are read next)
            self.from_c.flush()
        else:
            grads = self._timed(kernel.run, cotangents, env, total, self.xp)
        self.stats["plus_products"] += 1
        self.stats["plus_products_saved"] += len(terms) - 1
        for position, g in zip(sig.shared_grads(), grads):
            add_param(params, sig.shared[position], g)

    def _joined_from_c(self, terms, where):
        """(C-issued batches) Their values as one view of the slab or block they lie in, or
        None (``launches.Issuer.joined``)."""
        if self.from_c is None:
            return None
        found = self.from_c.joined(terms, where)
        if found is not None:
            self.stats["plus_copies_avoided"] += 1
        return found

    def _joined(self, slabs, spans, arrays, view=None):
        """The rows of several batches as one array: a view where their ``spans`` ((slab,
        first row, rows) each) follow each other in one slab, or their ``arrays`` are runs of
        rows of one array one after another (``_handed_blocks``), else one copy. ``view``: the
        spans' rows are a view's base rows, read through it (``arrays``, if given, are the
        view's own values)."""
        if spans is not None:
            slab, lo, _ = spans[0]
            end = lo
            for s, r, n in spans:
                if s != slab or r != end:
                    break
                end += n
            else:
                if len(spans) > 1:
                    self.stats["plus_copies_avoided"] += 1
                rows = slabs[slab][lo:end]
                return rows if view is None else view.of(rows)
        if spans is None and self.xp is np:
            found = _one_run_of_rows(arrays)  # (the handed cotangents, written into a block)
            if found is not None:
                self.stats["plus_copies_avoided"] += 1
                return found
        if arrays is None:
            arrays = [slabs[s][r:r + n] if view is None else view.of(slabs[s][r:r + n])
                      for s, r, n in spans]
        self.stats["plus_copies"] += 1
        return self.xp.concatenate(arrays)

    def release(self):
        for b in self.plan:
            b.env = b.handed = None
        self.gslabs = self.from_c = None


def device_clock():
    """Seconds the emulated device has spent in its stand-in library so far (0 where it is not
    loaded): what of a phase's time is not minicavs' own host work."""
    emulated = sys.modules.get("minicavs.cuda.emulated")
    return emulated.counter.device_seconds if emulated is not None else 0.0


def _made_from_c(env, key):
    """(ref, template) of value ``key`` of a batch whose forward was issued from C, or None."""
    made = getattr(env, "made", None)
    ref = made and made.values.get(key)
    return (ref, made) if ref is not None and ref.ld is not None else None


def _one_run_of_rows(arrays):
    """NumPy ``arrays`` that are consecutive runs of rows of one array, in order and with one
    layout, as one read-only view of all their rows; else None."""
    first = arrays[0]
    owner = first.base if type(first) is np.ndarray else None
    if owner is None or first.ndim == 0:
        return None
    tail, strides, step = first.shape[1:], first.strides, first.strides[0]
    at = kernels.data_address(first)
    for a in arrays:
        if type(a) is not np.ndarray or a.base is not owner or a.shape[1:] != tail or \
                a.strides != strides or a.dtype != first.dtype or kernels.data_address(a) != at:
            return None
        at += len(a) * step
    return np.lib.stride_tricks.as_strided(first, (sum(len(a) for a in arrays),) + tail,
                                           strides, writeable=False)


def add_param(params, t, g):
    entry = params.get(id(t))
    params[id(t)] = (t, g if entry is None else entry[1] + g)


def _groups(slabs, codes, rows, indices):
    """An operand's rows split by (slab, view): (slab, view, positions in the batch, rows,
    whether the rows are distinct) each, positions and rows as slices of ``indices``."""
    form = slabs * len(views.BY_CODE) + codes
    groups = []
    for f in np.unique(form).tolist():
        positions = np.flatnonzero(form == f)
        r = rows[positions]
        groups.append((int(slabs[positions[0]]), views.BY_CODE[int(codes[positions[0]])],
                       indices.add(positions), indices.add(r), len(np.unique(r)) == len(r)))
    return groups


class _Indices:
    """The row indices of a segment's gathers and scatters, made on the host while planning
    and moved to the device in one copy: an index array CuPy gets from the host is a copy and
    a synchronisation per call (measured on an H100: 120 µs a backward scatter). A plan entry
    holds a slice of them until :meth:`resolve`."""

    def __init__(self):
        self.parts, self.size = [], 0

    def add(self, array):
        self.parts.append(array)
        self.size += len(array)
        return slice(self.size - len(array), self.size)

    def resolve(self, plan, xp):
        """Every slice in the plan's entries as its indices: int64 on the host (the native
        loops read them so), int32 on a device (as its kernels take them)."""
        if not self.parts:
            return
        host = np.concatenate(self.parts)
        buffer = host if xp is np else xp.asarray(host.astype(np.int32))
        for b in plan:
            for i, entry in enumerate(b.inputs):
                rows = entry[3]
                if rows is None:
                    continue
                if isinstance(rows, slice):
                    rows = buffer[rows]
                else:
                    rows = [(slab, view, buffer[p], buffer[r], distinct)
                            for slab, view, p, r, distinct in rows]
                b.inputs[i] = b.targets[entry[0]] = entry[:3] + (rows,) + entry[4:]


def _repeats(rows, sizes):
    """Per batch (of ``sizes`` consecutive rows of ``rows``) and operand (column): whether
    a row appears twice — one sort for all batches, not a test per backward scatter."""
    batch = np.repeat(np.arange(len(sizes)), sizes)
    scale = int(rows.max(initial=0)) + 1
    ordered = np.sort(batch[:, None] * scale + rows, axis=0)
    at, k = np.nonzero(ordered[1:] == ordered[:-1])
    repeats = np.zeros((len(sizes), rows.shape[1]), dtype=bool)
    repeats[ordered[1:][at, k] // scale, k] = True
    return repeats


def _gather_groups(xp, slabs, groups, n):
    out = None
    for slab, view, positions, rows, _ in groups:
        part = (slabs[slab] if view is None else view.of(slabs[slab]))[rows]
        if out is None:
            out = xp.empty((n,) + tuple(part.shape[1:]), part.dtype)
        out[positions] = part
    return out


def _ranks(groups, num_groups, by=None):
    """Each element's rank among the elements of its group (in order, or by ``by``), and the
    group sizes."""
    order = np.argsort(groups, kind="stable") if by is None else np.lexsort((by, groups))
    counts = np.bincount(groups, minlength=num_groups)
    starts = np.cumsum(counts) - counts
    rank = np.empty(len(groups), dtype=np.int64)
    rank[order] = np.arange(len(groups)) - np.repeat(starts, counts)
    return rank, counts
