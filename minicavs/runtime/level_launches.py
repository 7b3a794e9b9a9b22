"""(CuPy) A level plan's launches as a table of integers, issued by C (``cuda/issuer.py``).

The interpreter's CuPy level loop already runs a level in few launches (:class:`Windows`: its
gathers in one at the start, its scatter-adds in one at the end; each fused group one generated
kernel over the call's arrays; each product one cuBLAS call). What is left is Python: a level
step binds its values, makes views and blocks and calls each launcher. Here a plan whose every
step is one of those launches — or a column window (a view: an offset) or a zero (no launch) —
is translated once into a table, and each of its levels becomes one C call that computes every
pointer from the level's first row::

    gather      f(state, child rows, destinations, n, lo)       (the Windows' launch)
    fused group f(call arrays, level blocks, n, lo)             (_LevelKernel)
    product     gemm(n x K · K x N), operands at their rows     (one cuBLAS call)
    row tensors f(operands, output, n, lo)                      (windows.tensor_source)
    scatter-add f(sources, child rows, state gradient, n, lo)

A value is found as ``table[slot] + offset + lo * row_bytes``: a batch value (the call's array,
at the level's rows), a block of the level (scratch the size of the call's largest level, made
once a call), a shared array, or a column window of one of them; a per-row tensor (a (V, a,
b) value, a reshape or broadcast of each row) also has its row's dims and element steps, and
an elementwise op or a sum over a row's axes on such values is one kernel of its own. A plan
with anything else (a step run by NumPy-style code, a per-level sum, a gather over edges, an
operand that must be copied to be contiguous) stays on the Python loop, with the reason
(``explain()``'s backend).
"""

from dataclasses import dataclass, replace

import numpy as np

from ..cuda import issuer, products
from ..cuda.kernels import device_address
from ..csource import C_TYPES, ElementwiseSource, compute_dtype, elementwise_source
from ..ops.batching import broadcast_strides, is_packed, packed_strides, row_domain
from .analysis import FusedGroup
from .plans import RUN
from .program import Compute


class Unsupported(Exception):
    """Why a level plan stays on the Python loop."""


@dataclass(frozen=True)
class Ref:
    """Where a value's rows are: ``table[slot] + offset + lo * row_bytes`` is the level's first
    row, rows ``ld`` elements apart, ``width`` columns (``row_bytes`` 0: a block of the level
    or a shared array). A per-row tensor (a (V, a, b, ...) value, or a view of a row as one)
    has its row's ``dims`` and its elements' ``steps`` along them (0 along a broadcast axis)."""

    thing: tuple
    row_bytes: int
    offset: int
    ld: int
    width: int
    dtype: np.dtype
    dims: tuple = None
    steps: tuple = None

    @property
    def axes(self):
        return self.dims if self.dims is not None else (self.width,)

    @property
    def strides(self):
        return self.steps if self.steps is not None else (1,)

    def packed(self):
        """Its row's elements lie one after another."""
        return is_packed(self.axes, self.strides)

    def contiguous(self):
        return self.offset == 0 and self.ld == self.width and self.packed()

    def viewed(self, dims, steps=None):
        """The same elements as a row of ``dims`` (``steps``: packed where not given)."""
        dims = tuple(int(d) for d in dims)
        return replace(self, width=int(np.prod(dims, dtype=np.int64)), dims=dims,
                       steps=packed_strides(dims) if steps is None else tuple(steps))

    def at(self):
        return (self.thing, self.row_bytes, self.offset)


ZERO = "zero"  # a value that is zero on the level (nothing made, a scatter of it adds nothing)


class LevelTables:
    """The issuer's tables of one call (per :class:`~.interpreter._BoundWindows`): each level
    plan's table (translated once per Program and layout, kept by its ``_LevelSteps``) and the
    call's pointer table, filled as plans need its entries."""

    def __init__(self, bound, driver):
        self.bound, self.driver = bound, driver
        self.windows, self.part, self.xp = bound.windows, bound.part, bound.xp
        self.slots = self.windows.issuer_slots  # thing -> slot, the Program's
        self.arrays = {}  # thing -> this call's array (kept alive while the call runs)
        self.address = device_address(self.xp)
        self.table = np.zeros(max(16, len(self.slots) + 1), np.int64)
        self.context = driver.context(self.table)
        self._max_rows = None
        self.ready = {}  # level steps -> its table, this call's entries filled (None: Python)
        self.queued = []  # (table, lo, n) of levels not yet issued

    def prepared(self, level, plan):
        """The table a level of ``plan`` (its ``_LevelSteps``: ``level``) is issued by, for
        this call, or None where the plan stays on the Python loop; a level is issued at the
        next :meth:`flush` once ``(table, first row, rows)`` is appended to :attr:`queued`
        (flush before a level run from Python: the queued levels come before it)."""
        found = self.ready.get(level, False)
        if found is False:
            found = self.ready[level] = self._prepare(level, plan)
        return found

    def flush(self):
        """Issue the queued levels, in order, in one C call (the pointer table, grown or not,
        has every entry they read)."""
        if self.queued:
            levels, self.queued = self.queued, []
            self.driver.issue_levels(levels, self.context)

    def _prepare(self, level, plan):
        """``level``'s table for this call with its pointers in place, or None."""
        tables = level.issuer_tables  # layout of the call's arrays -> (table, things, keys)
        if level.issuer_env_keys is None and level.issuer_why is not None:
            return None  # (translated once, and it stays on the Python loop)
        layout = self._layout(level.issuer_env_keys) if level.issuer_env_keys is not None \
            else None
        made = tables.get(layout) if layout is not None else None
        if made is None:
            try:
                made = Translation(self, level, plan).table()
            except Unsupported as why:
                level.issuer_why = str(why)
                return None
            level.issuer_env_keys = made[2]
            tables[self._layout(made[2])] = made
        table, things, _ = made
        arrays = self.arrays
        for thing in things:
            if thing not in arrays:
                self._fill(thing)
        return table

    def _layout(self, keys):
        """What a table assumes of the call's arrays: the layout of each of ``keys``, the
        state's dtype and ∂F's first row with children in order (its offset is in the table)."""
        env, states = self.part.env, self.part.states
        return tuple((a.shape[1:], a.strides, a.dtype) if (a := env.get(k)) is not None
                     else None for k in keys) + (None if states is None else states.dtype,
                                                 self.part.gradient_in_place)

    def slot(self, thing):
        slot = self.slots.get(thing)
        if slot is None:  # (two threads' calls: one number each, whichever stays is the slot)
            slot = self.slots.setdefault(thing, next(self.windows.issuer_numbers))
        return slot

    def _fill(self, thing):
        slot = self.slot(thing)
        if slot >= len(self.table):  # (a larger table: the context points at it)
            grown = np.zeros(max(2 * len(self.table), slot + 1), np.int64)
            grown[:len(self.table)] = self.table
            self.table, self.context = grown, self.driver.context(grown)
        array = self.array(thing)
        self.arrays[thing] = array
        self.table[slot] = self.address(array)

    def array(self, thing):
        """This call's array of ``thing``."""
        kind = thing[0]
        part, bound = self.part, self.bound
        if kind == "env":
            return part.env[thing[1]]
        if kind == "idx":
            return bound.idx[thing[1]]
        if kind == "states":
            return part.states
        if kind == "d_states":
            return part.d_states
        if kind == "bound":  # a level kernel's call arrays, as its Python launch binds them
            kernel, p = thing[1], thing[2]
            args = self.bound.kernel_args.get(kernel)
            if args is None:
                args = self.bound.kernel_args[kernel] = kernel.bind(part.env)
            return args[p]
        _, _, width, dtype = thing  # scratch: a block of the level, the largest level's size
        if self._max_rows is None:
            offsets = np.asarray(part.rows.level_offsets)
            self._max_rows = max(int(np.diff(offsets).max(initial=0)), 1)
        return self.xp.empty((self._max_rows, width), dtype)


class Translation:
    """One level plan's launches as a table (see the module docstring)."""

    def __init__(self, tables, level, plan):
        self.tables, self.level, self.plan = tables, level, plan
        self.part = tables.part
        self.program, self.env = self.part.program, self.part.env
        self.symbols = {x.key: x for x in self.program.graph.nodes}
        self.in_buffers = self.program.buffered | {p.key for p, *_ in self.program.aliases}
        self.refs, self.code, self.things, self.names, self.env_keys = {}, [], [], [], []
        # an elementwise step's output that only a sum reads: made inside the sum's kernel
        self.pending = {}  # key -> (ElementwiseSource, its inputs' operands and pointers)
        self.sums = {}  # key -> the one sum that reads it, where a sum is its only reader
        self.readers = {}  # key -> the level's steps that read it (None: a scatter-add)
        self.into_children = None  # Program.children_gradient where its product adds itself

    def table(self):
        """``(table, things, env keys)``: the :class:`~minicavs.cuda.issuer.Table`, the
        pointer-table entries it reads, and the call's values whose layout it assumes."""
        windows = self.tables.windows
        done, gathers, scatters, _ = windows.level(self.plan)
        if self.program.edge_parent is not None:
            raise Unsupported("the vertex function reads its edges' parents")
        found = self.program.children_gradient
        if found is not None and self.part.gradient_in_place is not None:
            # ∂F's children's gradients added into their block of rows by the product's gemm
            # (β = 1: native.py's INTO_CHILDREN): the adds of its columns are not launched
            own = {found[0], *found[1]}  # (a piece reads the product's columns or a window)
            if sorted(slot for slot, key, *_ in scatters if key in own) == \
                    list(range(found[2])):
                self.into_children = found
                scatters = [piece for piece in scatters if piece[1] not in own]
        if gathers:
            self.gather(gathers)
        self.readers = readers = {piece[1]: [None] for piece in scatters}
        for ins, action, *_ in self.level.steps:
            for x in ins.reads if action == RUN else ():
                readers.setdefault(x.key, []).append(ins)
        for key, found in readers.items():
            node = getattr(found[0].step, "node", None) if len(found) == 1 and isinstance(
                found[0], Compute) else None
            if node is not None and node.op.native == "sum" and key not in self.env:
                self.sums[key] = node
        for ins, action, sums, quick, kernel in self.level.steps:
            if sums:
                raise Unsupported(f"{_name(ins)} is a shared value summed over the levels")
            if action != RUN:
                for o in ins.writes:
                    if o.key in self.in_buffers:
                        self.clear(o.key)
                    else:
                        self.refs[o.key] = ZERO
            elif kernel is not None:
                self.level_kernel(kernel)
            else:
                self.compute(ins)
        if scatters:
            self.scatter(scatters)
        code = np.array([len(self.names)] + self.code, np.int64)
        names = list(self.names)
        return (issuer.Table(code, lambda op: names[op]), list(dict.fromkeys(self.things)),
                tuple(dict.fromkeys(self.env_keys)))

    # --- values -------------------------------------------------------------------------------

    def value(self, key):
        if key in self.pending:  # (read by more than its sum after all: made here)
            self.tensor_launch(*self.pending.pop(key))
        ref = self.refs.get(key)
        if ref is not None:
            return ref
        value, symbol = self.env.get(key), self.symbols.get(key)
        if value is None or symbol is None:
            raise Unsupported(f"{self.label(key)} is not made before it is read")
        domain = row_domain(symbol.shape)
        if domain not in ("vertex", None):
            raise Unsupported(f"{self.label(key)} has a row per {domain}")
        self.env_keys.append(key)
        if value.ndim == 2 and domain is None:  # a shared matrix: a product's operand, as it is
            return Ref(("env", key), 0, 0, None, value.shape[1], value.dtype)
        tail, item = value.shape[1:], value.itemsize
        if value.ndim < 2 or value.strides[0] % item or any(
                n != 1 and step != packed * item
                for n, step, packed in zip(tail, value.strides[1:], packed_strides(tail))):
            raise Unsupported(f"{self.label(key)} does not have contiguous rows")
        row = Ref(("env", key), value.strides[0], 0, value.strides[0] // item,
                  int(np.prod(tail, dtype=np.int64)), value.dtype)
        return row.viewed(tail) if len(tail) > 1 else row

    def label(self, key):
        symbol = self.symbols.get(key)
        return symbol.label() if symbol is not None else f"value {key}"

    def scratch(self, key, width, dtype, dims=None):
        ref = Ref(("scratch", key, width, np.dtype(dtype)), 0, 0, width, width, np.dtype(dtype))
        ref = self.refs[key] = ref.viewed(dims) if dims is not None and len(dims) > 1 else ref
        return ref

    def output(self, node, dtype):
        """Where ``node``'s rows on the level are written: its batch rows, or a new block."""
        dims = tuple(int(d) for d in node.shape[1:])
        if node.key in self.env:
            ref = self.value(node.key)
            if ref.axes != dims and ref.packed():
                ref = ref.viewed(dims)
            if ref.axes != dims or not ref.packed():
                raise Unsupported(f"{self.label(node.key)} is written into rows of another "
                                  f"shape")
            return ref
        return self.scratch(node.key, int(np.prod(dims, dtype=np.int64)), dtype, dims)

    def pointer(self, ref):
        self.things.append(ref.thing)
        slot = self.tables.slot(ref.thing)
        return [issuer.POINTER, slot, ref.row_bytes, ref.offset]

    def fixed(self, thing):
        self.things.append(thing)
        return [issuer.POINTER, self.tables.slot(thing), 0, 0]

    def launch(self, launcher, args, name):
        if len(args) + 2 > issuer.MAX_ARGS:
            raise Unsupported(f"{name} takes {len(args)} arrays")
        issuer.check_arguments(launcher.kernel, len(args) + 2)
        function = self.tables.driver.function(launcher.kernel)
        self.code += [issuer.LAUNCH, function, launcher.row_width, len(args) + 2]
        for arg in args:
            self.code += arg
        self.code += [issuer.ROWS, 0, 0, 0, issuer.FIRST, 0, 0, 0]
        self.names.append(name)

    # --- the level's launches -----------------------------------------------------------------

    def gather(self, pieces):
        bound = self.tables.bound
        launcher, _, homes = bound._gather_spec(self.plan, pieces)
        states = self.part.states
        slots = self.tables.windows.launches[(self.plan, states.dtype)][1]
        args = [self.fixed(("states",))] + [self.fixed(("idx", s)) for s in slots]
        for home, width in homes:
            if width:
                args.append(self.pointer(self.scratch(home, width, states.dtype)))
            else:  # a buffer: the kernel adds the level's first row itself
                self.value(home)
                args.append(self.fixed(("env", home)))
        self.launch(launcher, args, "the level's gathers")

    def zero(self, key):
        """``key`` is zero on the level: its rows cleared where it has rows of its own."""
        if key in self.env:
            self.clear(key)
        else:
            self.refs[key] = ZERO

    def clear(self, key):
        """Zeros into the level's rows of a buffer (what the plan's ZERO does to one)."""
        ref = self.value(key)
        if ref is ZERO or ref.ld is None or not ref.row_bytes:
            raise Unsupported(f"{self.label(key)} is cleared, and it is not a batch buffer")
        windows, shape = self.tables.windows, (ref.width, ref.ld, ref.dtype)
        launcher = windows.launches.get(("zero",) + shape)
        if launcher is None:
            launcher = windows.launches[("zero",) + shape] = windows.kernels.Launcher(
                windows.kernels.zero_source(*shape))
        self.launch(launcher, [self.pointer(ref)], f"zeros into {self.label(key)}")

    def level_kernel(self, kernel):
        args = [None] * kernel.size
        for p, key, dtype, _ in kernel.fixed:  # (the call's array as it is, where it can be)
            value = self.env[key]
            self.env_keys.append(key)
            as_is = value.dtype == dtype and value.flags.c_contiguous
            args[p] = self.fixed(("env", key) if as_is else ("bound", kernel, p))
        for p, key, dtype in kernel.reads:
            ref = self.refs.get(key)
            if ref is None or ref is ZERO or not ref.contiguous() or ref.dtype != dtype:
                raise Unsupported(f"a fused group reads {self.label(key)}, not a level's block")
            args[p] = self.pointer(ref)
        for p, key, dtype in kernel.writes:
            args[p] = self.pointer(self.scratch(key, kernel.width, dtype))
        self.launch(kernel.launch, args, "a fused group's kernel")

    def compute(self, ins):
        """A step other than a level kernel: a view, a product or a kernel of its own."""
        group = getattr(ins.step, "group", None) if isinstance(ins, Compute) else None
        if group is not None:
            return self.elementwise(group)
        node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
        native = node.op.native if node is not None else None
        if native == "window" and node.key not in self.in_buffers and len(node.shape) == 2 \
                and node.attrs["axis"] in (1, -1):
            source = self.value(node.inputs[0].key)
            if source is not ZERO and source.ld is None:
                raise Unsupported(f"{_name(ins)} is a window of a shared matrix")
            if source is ZERO:
                self.refs[node.key] = ZERO
                return
            start, stop = int(node.attrs["start"]), int(node.attrs["stop"])
            self.refs[node.key] = replace(source, offset=source.offset + start *
                                          source.dtype.itemsize, width=stop - start)
            return
        if native == "product" and all(len(x.shape) == 2 for x in (node, *node.inputs)):
            return self.product(node)
        if native == "view":
            return self.row_view(node)
        if native == "sum":
            return self.row_sum(node, ins.step.attrs)
        if node is not None and node.op.is_elementwise:
            inputs = list({x.key: x for x in node.inputs}.values())
            return self.elementwise(FusedGroup([node], inputs, [node]))
        raise Unsupported(f"{_name(ins)} runs as its own step")

    # --- per-row tensors (the RNTN's bilinear term: a reshape, a broadcast, mul, sum) --------

    def row_view(self, node):
        """reshape / broadcast_to of each row: a view of its input's rows, no launch — or a
        copy where it has rows of its own (a batch buffer) or its input's are not packed."""
        x = node.inputs[0]
        if row_domain(x.shape) != "vertex" or row_domain(node.shape) != "vertex":
            raise Unsupported(f"{node.op.name} {node.label()} is not one of each row")
        dims = tuple(int(d) for d in node.shape[1:])
        source = self.value(x.key)
        if source is ZERO:
            return self.zero(node.key)
        if node.op.name == "reshape":
            view = source.viewed(dims) if source.packed() else None
        else:
            steps = broadcast_strides(source.axes, source.strides, dims)
            if steps is None:
                raise Unsupported(f"broadcast_to {node.label()}: rows of {source.axes}")
            view = source.viewed(dims, steps)
        if view is not None and node.key not in self.env:
            self.refs[node.key] = view
            return
        out = self.output(node, source.dtype)  # (its rows, or packed ones of the level)
        if view is not None and (view.at(), view.ld, view.strides) == (out.at(), out.ld,
                                                                        out.strides):
            return  # (its input was made in its rows)
        copy = _copy_source(source.dtype)
        if view is not None:
            self.tensor_launch(*self.tensor_operands(copy, [(view, x)], dims), out, dims)
        else:  # (a reshape of rows that are not packed: packed first)
            self.tensor_launch(*self.tensor_operands(copy, [(source, x)], source.axes),
                               out.viewed(source.axes), source.axes)

    def elementwise(self, group):
        """A fused group (or one op) over per-row tensors, broadcasting, as one kernel; its
        output kept for the kernel of the sum that alone reads it."""
        if len(group.outputs) != 1:
            raise Unsupported(f"a fused group of {len(group.outputs)} outputs over per-row "
                              f"tensors")
        node, = group.outputs
        if row_domain(node.shape) != "vertex":
            raise Unsupported(f"{node.label()} has no row per vertex")
        dims = tuple(int(d) for d in node.shape[1:])
        source = elementwise_source(group, compute_dtype(group))
        inputs = []
        for x, (dtype, _, _) in zip(group.inputs, source.inputs):
            if row_domain(x.shape) == "vertex":
                ref = self.value(x.key)
            elif x.key in self.env and self.env[x.key].flags.c_contiguous:  # a shared array
                value = self.env[x.key]
                self.env_keys.append(x.key)
                ref = Ref(("env", x.key), 0, 0, 0, value.size, value.dtype).viewed(
                    value.shape or (1,))
            else:
                raise Unsupported(f"{node.label()} reads {self.label(x.key)}, made by its step")
            if ref is not ZERO and ref.dtype != np.dtype(dtype):
                raise Unsupported(f"{node.label()} reads {self.label(x.key)} as {dtype}")
            inputs.append((ref, x))
        made = self.tensor_operands(source, inputs, dims)
        if node.key in self.sums:
            self.pending[node.key] = made
        else:
            self.tensor_launch(*made, self.output(node, np.dtype(source.outputs[0][0])), dims)

    def row_sum(self, node, attrs):
        """A sum over axes of each row, one kernel; of an elementwise output read only here,
        that computation inside it (the RNTN's ``sum(reshape(x V) * x, -1)``: no product
        tensor stored)."""
        x = node.inputs[0]
        rank = len(x.shape)
        axes = sorted({int(a) % rank for a in attrs["axes"]} if attrs["axes"] is not None
                      else range(rank))
        if row_domain(x.shape) != "vertex" or 0 in axes:
            raise Unsupported(f"sum {node.label()} over the rows (a per-level sum)")
        dims = tuple(int(d) for d in x.shape[1:])
        made = self.pending.pop(x.key, None)
        if made is None:
            source = self.value(x.key)
            if source is ZERO:
                return self.zero(node.key)
            made = self.tensor_operands(_copy_source(source.dtype), [(source, x)], dims)
        self.tensor_launch(*made, self.output(node, made[0].outputs[0][0]), dims,
                           tuple(a - 1 for a in axes))

    def tensor_operands(self, source, inputs, dims):
        """``(source, operands, pointers)`` of a kernel over rows of ``dims`` reading
        ``inputs`` (``(ref or ZERO, symbol)``), broadcast to them."""
        operands, pointers = [], []
        for ref, x in inputs:
            if ref is ZERO:
                operands.append(None)
                continue
            steps = broadcast_strides(ref.axes, ref.strides, dims)
            if steps is None:
                raise Unsupported(f"{self.label(x.key) if x else 'a value'}: rows of "
                                  f"{ref.axes} read as {dims}")
            operands.append((ref.ld, steps))
            pointers.append(self.pointer(ref) if ref.ld else self.fixed(ref.thing))
        return source, operands, pointers

    def tensor_launch(self, source, operands, pointers, out, dims, summed=()):
        """One kernel over rows of ``dims`` into ``out`` (summed over the row's axes
        ``summed``: ``out`` has them as size 1, or not at all)."""
        if out.axes != tuple(d for k, d in enumerate(dims) if k not in summed) and \
                out.axes != tuple(1 if k in summed else d for k, d in enumerate(dims)):
            raise Unsupported(f"rows of {out.axes} written from {dims}")
        steps, kept = [0] * len(dims), iter(out.strides)
        for k in range(len(dims)):  # (the output's stride along each kept axis)
            if len(out.axes) == len(dims):
                steps[k] = 0 if k in summed else out.strides[k]
            elif k not in summed:
                steps[k] = next(kept)
        windows = self.tables.windows
        made = windows.kernels.tensor_source(source, tuple(operands) + (
            (out.ld, tuple(steps)),), dims, tuple(summed))
        launcher = windows.launches.get(made)
        if launcher is None:
            launcher = windows.launches[made] = windows.kernels.Launcher(made)
        self.launch(launcher, pointers + [self.pointer(out)],
                    f"kernel {made.name}" + (" (a sum)" if summed else ""))

    def product(self, node):
        a, b = (self.value(x.key) for x in node.inputs)
        if a is ZERO or b is ZERO:
            raise Unsupported(f"product {node.label()} reads a zero")
        if a.ld is None or b.ld is not None:  # (ld None: a shared matrix)
            raise Unsupported(f"product {node.label()} is not rows times a shared matrix")
        weight = self.env[b.thing[1]]
        add = self.into_children is not None and node.key == self.into_children[0]
        if add:  # the children of rows lo.. are rows arity (lo - first).. of the state gradient
            d, arity = self.part.d_states, self.into_children[2]
            row = d.shape[1] * d.itemsize
            if d.ndim != 2 or d.strides != (row, d.itemsize) or d.dtype != a.dtype:
                raise Unsupported("the state gradient's rows are not packed")
            out = Ref(("d_states",), arity * row, -arity * self.part.gradient_in_place * row,
                      arity * d.shape[1], arity * d.shape[1], d.dtype)
        elif node.key in self.env:
            out = self.value(node.key)
        else:
            out = self.into_reshape(node) or self.scratch(node.key, weight.shape[1], a.dtype)
        if out.thing == a.thing or out.dtype != a.dtype:
            raise Unsupported(f"product {node.label()} writes what it reads")
        at_b, at_a, at_out = (self.pointer(x)[1:] for x in (b, a, out))
        ops = products.row_product(self.tables.driver, weight, a.dtype, at_a, a.ld, at_b,
                                   at_out, out.ld, add)
        if ops is None:
            raise Unsupported(f"product {node.label()}: operands cuBLAS cannot take as they are")
        self.code += ops
        self.names.append(f"product {node.label()}")

    def into_reshape(self, node):
        """The rows of the batch buffer of the one reshape that reads ``node``, where it has
        one (the RNTN's ``reshape(x V)``, kept for ∂F): ``node`` is made there, no copy."""
        found = self.readers.get(node.key, ())
        reshape = getattr(found[0].step, "node", None) if len(found) == 1 and isinstance(
            found[0], Compute) else None
        if reshape is None or reshape.op.name != "reshape" or reshape.key not in self.env:
            return None
        out = self.value(reshape.key)
        if not out.packed():
            return None
        out = self.refs[node.key] = replace(out, dims=None, steps=None)
        return out

    def scatter(self, pieces):
        windows, out = self.tables.windows, self.part.d_states
        sources, keys, layout = [], {}, []
        for slot, key, start, width, column in pieces:
            ref = self.value(key)
            if ref is ZERO:  # (a zero level: adds nothing)
                continue
            if not ref.contiguous():
                raise Unsupported(f"a scatter-add reads {self.label(key)}, whose rows are not "
                                  f"contiguous")
            if key not in keys:
                keys[key] = len(sources)
                sources.append(ref)
            layout.append((slot, keys[key], start, ref.width, width, column))
        if not layout:
            return
        layout = tuple(layout)
        made = windows.launches.get((layout, out.dtype))
        if made is None:
            source = windows.kernels.scatter_source(layout, out.shape[1], out.dtype)
            made = windows.launches[(layout, out.dtype)] = (
                windows.kernels.Launcher(source), sorted({p[0] for p in layout}))
        args = [self.pointer(ref) for ref in sources] + [
            self.fixed(("idx", s)) for s in made[1]] + [self.fixed(("d_states",))]
        self.launch(made[0], args, "the level's scatter-adds")


def _copy_source(dtype):
    """The body of a copy (or, summed, a sum) of one value."""
    name, ctype = np.dtype(dtype).name, C_TYPES[np.dtype(dtype)]
    return ElementwiseSource(f"minicavs_copy_{name}", name, "", "", "y0 = x0;", "",
                             ((name, ctype, "x0"),), ((name, ctype, "y0"),), ("copy",))


def _name(ins):
    node = getattr(getattr(ins, "step", None), "node", None)
    return node.label() if node is not None else type(ins).__name__
