"""A Program's level loop as one C++ function.

The core of a Program (program.py) runs once per level; on the interpreter that is a Python
call per instruction per level. Here the whole loop becomes one function, so F costs one call
from Python (plus its few eager and lazy instructions, which stay whole-batch NumPy/BLAS calls):

    void minicavs_levels(num_levels, first, stop, offsets, plan, p, a, spare, ...):
        for levels first..stop of the loop's order (bottom-up for F, top-down for ∂F):
            lo, n = the level's first row and row count
            for each core instruction k:
                plan[t][k] says RUN (its code below), ZERO (write zeros) or SKIP

The plan is the interpreter's own (``plans.py``, computed per call in Python), so both backends
skip and zero the same work. One cell runs all its levels in one call; kinds, stepping several
programs together, call each program for its runs of consecutive levels. Every per-row value the core touches is a strided
matrix, one row per vertex of the level:

* **batch** values exist before the loop, with a row for every vertex of the batch (buffers,
  aliased concat parts, eager results, F's values read by ∂F): row i of level t is row lo + i;
* **scratch** values live only during a level (a gather's block, a product): ``n_max`` rows;
* **windows** (slice_axis, ``Op.native == "window"``) are views: a column offset into the value
  they slice, no copy.

Instructions become loops or calls:

* ``Gather``: row copies from F's scattered state (an absent child, -1, reads the spare row);
  ``ScatterAdd``: row adds into ∂F's state gradient;
* an elementwise op or fused group: a loop over rows (split between cores with OpenMP) and
  columns (``omp simd``: vectorised, with libmvec's ``exp``/``tanh``), whose body is the
  *same C* the CUDA ElementwiseKernels run (``csource.elementwise_source``);
* a matrix product (``Op.native == "product"``) of per-row ``X`` and a shared ``W``: one BLAS
  gemm (``blas.py``), its transposition read from ``W``'s strides at call time;
* a concat (``Op.assembles_in_place``): nothing if its parts wrote its columns, else column copies.

A program holding anything else (another op, edge lists, a per-level sum) raises
:class:`Unsupported`, with the reason; that program stays on the interpreter.
"""

import re
from dataclasses import dataclass

import numpy as np

from .. import csource
from ..cpu import products as native_products
from ..ops.batching import broadcast_strides, is_packed, packed_strides, row_domain
from .analysis import FusedGroup
from .plans import RUN, SKIP, ZERO
from .program import Compute, Gather

ACTIONS = {SKIP: 0, RUN: 1, ZERO: 2}  # plan codes, as the generated loop reads them
# ∂F's product of the children's gradients (Program.children_gradient) added straight into
# their rows, on a level whose children are one block of rows (native.py sets it); or written
# there, where nothing else writes those rows and they were not cleared (Part.stale_children)
INTO_CHILDREN, ONTO_CHILDREN = 3, 4
# An elementwise step run with one of its per-row inputs zero on the level (a leaf's product of
# its children, an internal vertex's embedded word): code VARIANTS + j reads 0 for the j-th of
# LevelLoop.variants[k] instead of its rows (native.py chooses it from the level's zeros).
VARIANTS, MAX_VARIANTS = 8, 3
ENTRY = "minicavs_levels"
# One loop per row: for a split by rows, a row-parallel loop the team shares.
TEAM_FOR = "#pragma omp for schedule(static)"


# The names a fused group's C uses (csource.py): inputs x0.., temporaries t0.., outputs y0..
_NAMES = re.compile(r"\b[xty]\d+\b")


class Unsupported(Exception):
    """The program has something the native backend does not compile (the message says what)."""


@dataclass(frozen=True)
class Slot:
    """One argument of the generated function: ``p[index]`` its pointer, ``a[2 * index]`` its
    row stride in elements, ``a[2 * index + 1]`` a flag (a shared matrix: transposed).
    ``kind``: "batch" / "shared" (a value of the environment, ``node``), "scratch" (``width``
    columns), "child" (child ``slot``'s row per vertex), "states" / "d_states"."""

    index: int
    kind: str
    node: object = None
    width: int = 0
    slot: object = None


@dataclass(frozen=True)
class View:
    """Row i of a per-row value on the current level: ``base + i * ld + col``. A per-row
    tensor (a value of shape (V, a, b, ...)) has its row's ``shape`` and the ``strides`` of
    its elements along each axis (0 along a broadcast axis); a plain row has neither."""

    base: str
    ld: str
    col: int
    width: int
    shape: tuple = None
    strides: tuple = None

    def row(self, i):
        return f"({self.base} + ({i}) * {self.ld} + {self.col})"

    @property
    def axes(self):
        return self.shape if self.shape is not None else (self.width,)

    @property
    def steps(self):
        return self.strides if self.strides is not None else (1,)

    @property
    def contiguous(self):
        """Its row's elements lie one after another (it can be copied, zeroed, multiplied)."""
        return is_packed(self.axes, self.steps)

    def reshaped(self, shape, strides=None):
        shape = tuple(shape)
        return View(self.base, self.ld, self.col, int(np.prod(shape, dtype=np.int64)),
                    shape if len(shape) > 1 or strides is not None else None,
                    strides if strides is not None else
                    (packed_strides(shape) if len(shape) > 1 else None))


def _index(strides, axes):
    """The C offset of the element at loop indices ``u<d>`` (d in ``axes``) with ``strides``."""
    terms = [f"u{d}" if s == 1 else f"u{d} * {s}" for d, s in zip(axes, strides) if s != 0]
    return " + ".join(terms) or "0"


def _aligned_to(shape, strides, target):
    steps = broadcast_strides(shape, strides, target)
    if steps is None:
        raise Unsupported(f"a row of shape {tuple(shape)} broadcast against {tuple(target)}")
    return steps


def _loads(inputs, shape):
    """Row pointers ``r<k>`` and loads ``const T x<k>`` of ``inputs`` (Views, or ``("shared",
    slot, shape)``) at the element ``u0, u1, ...`` of a row of ``shape``, broadcast to it."""
    axes = range(len(shape))
    rows, loads = [], []
    for k, x in enumerate(inputs):
        if isinstance(x, View):
            rows.append(f"const T *__restrict__ r{k} = {x.row('i')};")
            steps = _aligned_to(x.axes, x.steps, shape)
            loads.append(f"const T x{k} = r{k}[{_index(steps, axes)}];")
        else:
            _, slot, xshape = x
            steps = _aligned_to(xshape, packed_strides(xshape), shape)
            loads.append(f"const T x{k} = P{slot}[{_index(steps, axes)}];")
    return rows, loads


def _is_elementwise(ins):
    step = ins.step
    return getattr(step, "group", None) is not None or step.node.op.is_elementwise


@dataclass(frozen=True)
class LevelLoop:
    """The generated source and what its arguments are."""

    source: str
    dtype: np.dtype
    slots: tuple
    num_core: int
    actions: dict = None  # RUN/ZERO/SKIP -> the code the loop reads
    notes: tuple = ()  # each core instruction, as the program's dump writes it
    products: tuple = ()  # (shared slot, k, m) of each product x (n x k) . W (k x m)
    row_work: tuple = (0, 1)  # (multiply-adds, elements) of a level's row, over the core
    variants: tuple = ()  # per core instruction, the input keys it has a zero variant for


def generate(program, blas="cblas64", profile=False):
    """The :class:`LevelLoop` of ``program``'s core, calling a gemm of interface ``blas``
    (``blas.py``); raises :class:`Unsupported`. ``profile``: the loop also sums the seconds
    each instruction takes (``minicavs_profile``; ``MINICAVS_NATIVE_PROFILE=1``)."""
    return _Generator(program, blas, profile).loop()


def _tail(node):
    """The shape of one row of the per-row value ``node`` (its axes after the first)."""
    tail = node.shape[1:]
    if not all(isinstance(n, (int, np.integer)) for n in tail):
        raise Unsupported(f"per-row value {node.label()} has shape {node.shape} (the native "
                          f"loop takes rows of a fixed shape)")
    return tuple(int(n) for n in tail)


def _width(node):
    return int(np.prod(_tail(node), dtype=np.int64))


def _row_view(base, ld, node):
    """The view of a per-row value stored one packed row per vertex."""
    tail = _tail(node)
    return View(base, ld, 0, _width(node)).reshaped(tail) if len(tail) > 1 else \
        View(base, ld, 0, _width(node))


class _Generator:
    def __init__(self, program, blas, profile=False):
        self.program, self.blas, self.profile = program, blas, profile
        self.names = {n.key: i for i, n in enumerate(program.graph.nodes)}
        self.slots = []
        self.views = {}  # node.key -> View (per-row values)
        self.shared = {}  # node.key -> Slot (values without rows)
        self.children = {}  # child slot -> Slot
        self.dtype = None
        self.inlined = {}  # node.key -> (Compute, output index, column, width): no rows of its own
        self.concats = {}  # node.key -> [(View, column)]: a concat added by its parts
        self.prewritten = set()  # window keys whose rows a direct gather wrote
        self.readers = {}  # node.key -> core instructions reading it
        self.zero_through = {}  # node.key -> the view a ZERO clears for it (a broadcast's source)
        self.written_for = set()  # reshape keys whose producer writes their rows directly
        self.gathered_parts = set()  # concat parts a direct gather wrote into their columns
        self.summed = {}  # node.key -> the elementwise step computed inside the sum reading it
        self.products = set()  # (shared slot, k, m) of the products
        self.variants = {}  # core index -> input keys of its zero variants (VARIANTS)

    def _dtype(self):
        touched = [x for ins in self.program.core for x in (*ins.reads, *ins.writes)]
        dtypes = {np.dtype(x.dtype) for x in touched}
        if len(dtypes) != 1 or next(iter(dtypes)) not in csource.COMPUTE_DTYPES:
            raise Unsupported(f"the level loop holds values of dtypes {sorted(map(str, dtypes))} "
                              f"(the native loop takes one, float32 or float64)")
        return next(iter(dtypes))

    def _slot(self, kind, **fields):
        slot = Slot(len(self.slots), kind, **fields)
        self.slots.append(slot)
        return slot

    def loop(self):
        program = self.program
        if program.edge_parent is not None:
            raise Unsupported("the vertex function gathers over edges (gather_sum)")
        self.dtype = self._dtype()
        core = program.core
        written = {o.key for ins in core for o in ins.writes}
        bound = set(program.buffered) | {part.key for part, *_ in program.aliases}
        for ins in core:  # everything the loop reads that exists before it
            bound |= {x.key for x in ins.reads if x.key not in written}
        nodes = {n.key: n for n in program.graph.nodes}
        for key in sorted(bound, key=self.names.get):
            node = nodes[key]
            domain = row_domain(node.shape)
            if domain == "edge":
                raise Unsupported(f"value {node.label()} has a row per edge")
            if domain == "vertex":
                slot = self._slot("batch", node=node)
                self.views[key] = _row_view(f"B{slot.index}", f"L{slot.index}", node)
            else:
                self.shared[key] = self._slot("shared", node=node)
        for ins in core:
            for x in ins.reads:
                self.readers.setdefault(x.key, []).append(ins)
        self.place_level_values()
        body = [self.instruction(k, ins) for k, ins in enumerate(core)]
        if self.profile:  # thread 0 times each instruction, its barrier included
            body = [f"    {{ const double started_{k} = omp_get_wtime();\n{code}\n"
                    f"    #pragma omp master\n"
                    f"    minicavs_seconds[{k}] += omp_get_wtime() - started_{k}; }}"
                    for k, code in enumerate(body)]
        notes = tuple(" ".join(ins.dump(self.names).split()) for ins in core)
        return LevelLoop(self.source(body), self.dtype, tuple(self.slots), len(core), ACTIONS,
                         notes, tuple(sorted(self.products)), self.row_work(),
                         tuple(self.variants.get(k, ()) for k in range(len(core))))

    def place_level_values(self):
        """A value that lives only during its level and that one step reads is made where that
        step wants it: a reshape's input in the rows of the reshape's buffer (the product or
        group writes them; no copy), an elementwise group's output inside the loop of the
        per-row sum that reads it (never stored: the RNTN's (x V) * x, summed)."""
        outside = self.program.read_outside_core
        producers = {o.key: ins for ins in self.program.core for o in ins.writes}
        for ins in self.program.core:
            node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
            if node is None or ins.inlined or not node.inputs:
                continue
            x = node.inputs[0]
            producer = producers.get(x.key)
            if x.key in outside or self.readers.get(x.key) != [ins] or \
                    not isinstance(producer, Compute) or producer.inlined or \
                    len(producer.writes) != 1:
                continue
            if node.op.native == "view" and node.op.name == "reshape" and \
                    node.key in self.views and self.views[node.key].contiguous:
                self.views[x.key] = self.views[node.key].reshaped(_tail(x))
                self.written_for.add(node.key)
            elif node.op.native == "sum" and _is_elementwise(producer):
                self.summed[x.key] = producer

    # --- values ---------------------------------------------------------------------------------

    def view(self, node):
        view = self.views.get(node.key)
        if view is None:
            raise Unsupported(f"value {node.label()} is read by the level loop before it is "
                              f"written")
        return view

    def output(self, node):
        """The view an instruction writes ``node`` to: its batch rows, or new scratch rows."""
        if row_domain(node.shape) != "vertex":
            raise Unsupported(f"the level loop computes {node.label()} of shape {node.shape}, "
                              f"which has no row per vertex (a per-level sum)")
        view = self.views.get(node.key)
        if view is None:
            width = _width(node)
            slot = self._slot("scratch", node=node, width=width)
            view = self.views[node.key] = _row_view(f"P{slot.index}", str(width), node)
        return view

    def child(self, slot):
        if slot == "edges":
            raise Unsupported("the vertex function gathers over edges (gather_sum)")
        if slot not in self.children:
            self.children[slot] = self._slot("child", slot=slot)
        return f"C{self.children[slot].index}"

    # --- instructions ---------------------------------------------------------------------------

    def instruction(self, k, ins):
        note = " ".join(ins.dump(self.names).split())
        zero_views = None
        if isinstance(ins, Compute) and ins.inlined:
            node = getattr(ins.step, "node", None)
            if node is not None and node.op.assembles_in_place:
                self.concat_parts(node)
            else:
                for p, o in enumerate(ins.writes):
                    self.inlined[o.key] = (ins, p, 0, _width(o))
            return f"    // [{k}] {note}: computed where it is read"
        if isinstance(ins, Compute) and ins.writes[0].key in self.summed:
            return f"    // [{k}] {note}: computed inside the sum that reads it"
        if isinstance(ins, Compute):
            if any(ins.accumulate):
                raise Unsupported("a value is summed over levels (lazy_batching is off)")
            run = self.compute(ins)
        elif isinstance(ins, Gather) and ins.direct:
            run, zero_views = self.direct_gather(ins)
        elif isinstance(ins, Gather):
            run = self.gather(ins)
        else:
            run = self.scatter_add(ins)
        if zero_views is None:  # (a broadcast view is zero where its source is: clear that)
            zero_views = [self.zero_through.get(o.key, self.views[o.key]) for o in ins.writes
                          if o.key in self.views]
        zero = "\n".join(self.zero(v) for v in zero_views)
        into = self.children_gradient(ins)
        variants = "".join(f" else if (act[{k}] == {VARIANTS + j}) {{  // %{self.names[key]} "
                           f"is zero\n{_indent(code, 6)}\n    }}"
                           for j, (key, code) in enumerate(self.zero_variants(k, ins)))
        return (f"    // [{k}] {note}\n"
                f"    if (act[{k}] == {ACTIONS[RUN]}) {{\n{_indent(run, 6)}\n    }}" + variants
                + (f" else if (act[{k}] == {ACTIONS[ZERO]}) {{\n{_indent(zero, 6)}\n    }}"
                   if zero else "")
                + (f" else if (act[{k}] == {INTO_CHILDREN}) {{  // added into the children's "
                   f"rows\n{_indent(into.format(beta=1), 6)}\n    }} else if (act[{k}] == "
                   f"{ONTO_CHILDREN}) {{  // written there\n{_indent(into.format(beta=0), 6)}\n"
                   f"    }}" if into else ""))

    def zero_variants(self, k, ins):
        """``[(input key, code)]``: an elementwise step's loop with one of its per-row inputs
        read as 0, for those a level may have zero (read by the core and made there, or a
        zero candidate); recorded in :attr:`variants`."""
        group = getattr(ins.step, "group", None) if isinstance(ins, Compute) else None
        if group is None and isinstance(ins, Compute) and ins.step.node.op.is_elementwise:
            group = FusedGroup([ins.step.node], ins.step.node.inputs, [ins.step.node])
        if group is None or any(o.key in self.summed for o in group.outputs):
            return []
        may_be_zero = {key for key, _ in self.program.zero_candidates} | {
            o.key for other in self.program.core for o in other.writes}
        keys = [x.key for x in group.inputs if row_domain(x.shape) == "vertex"
                and x.key not in self.inlined and x.key in may_be_zero][:MAX_VARIANTS]
        found = []
        for key in keys:
            try:
                found.append((key, self.elementwise(group, zero=key)))
            except Unsupported:  # (a loop over per-row tensors: no variants)
                return []
        self.variants[k] = tuple(key for key, _ in found)
        return found

    def children_gradient(self, ins):
        """The gemm adding ∂F's product of the children's gradients into their rows of the
        state gradient — one block, ``arity`` rows to a parent; ``{beta}``: 1 adds, 0 writes —
        or None for another instruction."""
        found = self.program.children_gradient
        if found is None or not isinstance(ins, Compute) or ins.writes[0].key != found[0]:
            return None
        x, w = ins.step.node.inputs
        a = self.view(x)
        k, m = (int(d) for d in w.shape)
        s = self.shared[w.key].index
        return (f"gemm_team({s}, n, {m}, {k}, P{s}, a[{2 * s}], a[{2 * s + 1}], {a.row(0)}, "
                f"{a.ld}, d_states + {self.child(0)}[lo] * d_states_ld, {found[2]} * d_states_ld, "
                f"split_macs, PANELS({s}), (T){{beta}});")

    def compute(self, ins):
        step = ins.step
        group = getattr(step, "group", None)
        if group is not None:
            return self.elementwise(group)
        node = step.node
        op = node.op
        if op.is_elementwise:
            return self.elementwise(FusedGroup([node], node.inputs, [node]))
        if op.native == "window":
            return self.window(node, step.attrs)
        if op.native == "product":
            return self.product(node)
        if op.native == "view":
            return self.row_view(node)
        if op.native == "sum":
            return self.row_sum(node, step.attrs)
        if op.native == "pad":
            return self.row_pad(node, step.attrs)
        if op.assembles_in_place:
            return self.concat(node, step.attrs, ins.aliased)
        raise Unsupported(f"op '{op.name}' ({node.label()}) has no native form in a level loop")

    def window(self, node, attrs):
        x = node.inputs[0]
        axis = int(attrs["axis"]) % len(x.shape) if len(x.shape) > 1 else 0
        if row_domain(x.shape) != "vertex" or axis == 0:
            raise Unsupported(f"slice_axis {node.label()}: only windows of each row run "
                              f"natively")
        start, stop = int(attrs["start"]), int(attrs["stop"])
        if x.key in self.inlined:  # a window of a value computed where it is read
            if len(x.shape) != 2:
                raise Unsupported(f"slice_axis {node.label()} of a value computed where read")
            producer, index, col, _ = self.inlined[x.key]
            self.inlined[node.key] = (producer, index, col + start, stop - start)
            return "// a window of a value computed where it is read"
        if node.key in self.prewritten:
            return "// the gather wrote its rows"
        source = self.view(x)
        if source.shape is None:  # columns start:stop of a plain row
            window = View(source.base, source.ld, source.col + start, stop - start)
        else:  # indices start:stop along one axis of a per-row tensor
            shape = list(source.axes)
            shape[axis - 1] = stop - start
            window = View(source.base, source.ld, source.col + start * source.steps[axis - 1],
                          0).reshaped(shape, source.steps)
            if window.contiguous and len(shape) == 1:
                window = View(window.base, window.ld, window.col, window.width)
        if node.key in self.views:  # it has rows of its own (a buffer): copy the columns
            target = self.views[node.key]
            if window.contiguous and target.contiguous:
                return self.copy_columns(window, target)
            return self.tensor_loop([target.reshaped(window.axes)], [window], ["y0 = x0;"])
        if not window.contiguous:  # zero where its source is: a ZERO clears the source
            self.zero_through[node.key] = self.zero_through.get(x.key, source)
        self.views[node.key] = window
        return "// a view: nothing to do"

    def row_view(self, node):
        """reshape / broadcast_to of each row (``Op.native == "view"``): a new view of the
        input's rows, no copy — or a copy where the value has rows of its own (a buffer)."""
        x = node.inputs[0]
        if row_domain(x.shape) != "vertex" or row_domain(node.shape) != "vertex" \
                or node.shape[0] != x.shape[0] or x.key in self.inlined:
            raise Unsupported(f"{node.op.name} {node.label()}: only a reshape or broadcast of "
                              f"each row runs natively")
        if node.key in self.written_for:
            return "// its input was written into its rows"
        source, shape = self.view(x), _tail(node)
        if node.op.name == "reshape":
            if not source.contiguous:  # a broadcast or strided row: copied, packed, first
                out = self.output(node)
                return self.tensor_loop([out.reshaped(source.axes)], [source], ["y0 = x0;"])
            view = source.reshaped(shape)
        else:  # broadcast_to: the input's axes, right-aligned; stride 0 where it has size 1
            if len(x.shape) != len(node.shape):
                raise Unsupported(f"broadcast_to {node.label()} adds axes to each row")
            view = source.reshaped(shape, _aligned_to(source.axes, source.steps, shape))
        if node.key in self.views:  # it has rows of its own: copy the elements
            target = self.views[node.key]
            return self.tensor_loop([target.reshaped(shape)], [view], ["y0 = x0;"])
        if not view.contiguous:  # zero where its source is: a ZERO clears the source
            self.zero_through[node.key] = self.zero_through.get(x.key, source)
        self.views[node.key] = view
        return "// a view of its input's rows: nothing to do"

    def row_sum(self, node, attrs):
        """A sum over axes of each row (``Op.native == "sum"``), into the output's rows; of
        an elementwise group's output, the group computed where the sum reads it."""
        x = node.inputs[0]
        rank = len(x.shape)
        axes = sorted({int(a) % rank for a in attrs["axes"]} if attrs["axes"] is not None
                      else set(range(rank)))
        if row_domain(x.shape) != "vertex" or 0 in axes or x.key in self.inlined:
            raise Unsupported(f"sum {node.label()} over the rows (a per-level sum)")
        out = self.output(node)
        if not out.contiguous:
            raise Unsupported(f"sum {node.label()} into a strided row")
        shape = _tail(x)
        if x.key in self.summed:  # the group's statements, at the element being added
            group = self.group_of(self.summed[x.key])
            rows, loads = self.element_loads(group, shape)
            element = "\n".join(loads + ["T y0;", csource.elementwise_source(
                group, self.dtype).operation]) + "\n"
            value = "y0"
        else:
            source = self.view(x)
            rows = [f"const T *__restrict__ x = {source.row('i')};"]
            element, value = "", f"x[{_index(source.steps, range(len(shape)))}]"
        summed = [a - 1 for a in axes]  # axes of the row
        kept = [d for d in range(len(shape)) if d not in summed]
        out_index = _index(packed_strides([shape[d] for d in kept]), kept)

        def loops(dims):
            return "".join(f"for (int64_t u{d} = 0; u{d} < {shape[d]}; ++u{d})\n" for d in dims)

        last = len(shape) - 1
        if summed == list(range(len(shape) - len(summed), len(shape))):
            # the last axes: one running total per output element, vectorised over the last
            body = (f"{loops(kept)}{{\n  T total = 0;\n"
                    + (_indent(loops(summed[:-1]), 2) + "\n" if summed[:-1] else "") +
                    f"  #pragma omp simd reduction(+:total)\n"
                    f"  for (int64_t u{last} = 0; u{last} < {shape[last]}; ++u{last}) {{\n"
                    f"{_indent(element, 4)}    total += {value};\n  }}\n"
                    f"  o[{out_index}] = total;\n}}")
        else:  # an inner axis: add each slice into the zeroed output, vectorised over the last
            body = (f"std::memset(o, 0, {out.width} * sizeof(T));\n{loops(range(last))}"
                    f"#pragma omp simd\n"
                    f"for (int64_t u{last} = 0; u{last} < {shape[last]}; ++u{last}) {{\n"
                    f"{_indent(element, 2)}  o[{out_index}] += {value};\n}}")
        return (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"{_indent(chr(10).join(rows), 2)}\n"
                f"  T *__restrict__ o = {out.row('i')};\n"
                f"{_indent(body, 2)}\n}}")

    def row_pad(self, node, attrs):
        """Each row zero-padded along one axis (``Op.native == "pad"``): the output's rows
        cleared, then the input copied into its window."""
        x = node.inputs[0]
        axis = int(attrs["axis"]) % len(x.shape)
        if row_domain(x.shape) != "vertex" or axis == 0 or x.key in self.inlined:
            raise Unsupported(f"pad_axis {node.label()}: only padding within each row runs "
                              f"natively")
        source, out = self.view(x), self.output(node)
        if not out.contiguous:
            raise Unsupported(f"pad_axis {node.label()} into a strided row")
        shape = list(out.axes)
        steps = packed_strides(shape)
        shape[axis - 1] = source.axes[axis - 1] if source.shape is not None else source.width
        window = View(out.base, out.ld, out.col + int(attrs["before"]) * steps[axis - 1],
                      0).reshaped(shape, steps)
        return (self.zero(out) + "\n"
                + self.tensor_loop([window], [source.reshaped(shape)], ["y0 = x0;"],
                                   check_outputs=False))

    def tensor_loop(self, outs, inputs, operation, check_outputs=True):
        """An elementwise loop over per-row tensors: rows split between the team, then each
        row's elements (axes u0, u1, ..., the last vectorised), every input read through its
        strides (0: broadcast). ``inputs``: Views, or ``("shared", slot, shape)``."""
        shape = outs[0].axes
        if any(o.axes != shape or check_outputs and not o.contiguous for o in outs):
            raise Unsupported("a fused group with outputs of different shapes")
        axes = range(len(shape))
        rows, loads = _loads(inputs, shape)
        for p, view in enumerate(outs):
            rows.append(f"T *__restrict__ o{p} = {view.row('i')};")
        at = _index(outs[0].steps, axes)
        body = "\n".join(loads) + "\n" + "\n".join(
            f"T y{p};" for p in range(len(outs))) + "\n" + "\n".join(operation) + "\n" + \
            "\n".join(f"o{p}[{at}] = y{p};" for p in range(len(outs)))
        last = len(shape) - 1
        loops = "".join(f"for (int64_t u{d} = 0; u{d} < {shape[d]}; ++u{d})\n"
                        for d in range(last))
        return (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"{_indent(chr(10).join(rows), 2)}\n"
                + (_indent(loops, 2) + "\n" if loops else "") +
                f"  #pragma omp simd\n"
                f"  for (int64_t u{last} = 0; u{last} < {shape[last]}; ++u{last}) {{\n"
                f"{_indent(body, 4)}\n  }}\n}}")

    def concat(self, node, attrs, aliased):
        out = self.output(node)
        if aliased:
            return "// its parts wrote its columns"
        if len(node.shape) != 2 or attrs["axis"] not in (1, -1):
            raise Unsupported(f"concat {node.label()}: only along the columns of per-row "
                              f"matrices")
        code, col = [], 0
        for part in node.inputs:
            view = self.view(part) if row_domain(part.shape) == "vertex" else None
            if view is None:
                raise Unsupported(f"concat {node.label()}: a part without rows")
            if part.key not in self.gathered_parts:  # (a direct gather wrote those columns)
                code.append(self.copy_columns(view, View(out.base, out.ld, out.col + col,
                                                         view.width)))
            col += view.width
        return "\n".join(code) or "// the gathers wrote its columns"

    def product(self, node):
        x, w = node.inputs
        if row_domain(x.shape) != "vertex" or len(x.shape) != 2 or row_domain(w.shape) or \
                len(w.shape) != 2 or w.key not in self.shared:
            raise Unsupported(f"matmul {node.label()}: only per-row X times a shared matrix W "
                              f"runs natively")
        a, out = self.view(x), self.output(node)
        if a.shape is not None or not a.contiguous:
            raise Unsupported(f"matmul {node.label()}: X's rows are not packed")
        k, m = (int(d) for d in w.shape)
        s = self.shared[w.key].index
        self.products.add((s, k, m))
        return (f"gemm_team({s}, n, {m}, {k}, P{s}, a[{2 * s}], a[{2 * s + 1}], "
                f"{a.row(0)}, {a.ld}, {out.row(0)}, {out.ld}, split_macs, PANELS({s}));")

    def elementwise(self, group, zero=None):
        """The loop of an elementwise group; ``zero``: the key of a per-row input read as 0."""
        source = csource.elementwise_source(group, self.dtype)
        outs = [self.output(o) for o in group.outputs]
        if any(o.shape is not None for o in outs) or any(
                row_domain(x.shape) == "vertex" and x.key not in self.inlined
                and self.view(x).shape is not None for x in group.inputs):
            if zero is not None:
                raise Unsupported("a zero variant of a loop over per-row tensors")
            return self.tensor_elementwise(group, outs, source)
        width = outs[0].width
        if any(o.width != width for o in outs):
            raise Unsupported("a fused group with outputs of different widths")
        rows, loads = [], []
        self.inline_rows = rows
        for k, x in enumerate(group.inputs):
            if x.key in self.inlined:
                if self.inlined[x.key][3] not in (width, 1):
                    raise Unsupported(f"{x.label()} broadcast against {width} columns")
                loads.append(self.inline_value(x.key, "j", f"x{k}"))
                continue
            if row_domain(x.shape) == "vertex":
                view = self.view(x)
                if view.width not in (width, 1):
                    raise Unsupported(f"{x.label()} ({view.width} columns) broadcast against "
                                      f"{width} columns")
                if x.key == zero:
                    loads.append(f"const T x{k} = (T)0;")
                    continue
                rows.append(f"const T *__restrict__ r{k} = {view.row('i')};")
                loads.append(f"const T x{k} = r{k}[{'j' if view.width == width else 0}];")
            else:
                size = int(np.prod(x.shape, dtype=np.int64))
                if size != 1 and (size != width or x.shape[-1] != width):
                    raise Unsupported(f"{x.label()} of shape {x.shape} broadcast against rows "
                                      f"of {width}")
                s = self.shared_slot(x)
                loads.append(f"const T x{k} = P{s}[{'j' if size > 1 else 0}];")
        for p, view in enumerate(outs):
            rows.append(f"T *__restrict__ o{p} = {view.row('i')};")
        body = "\n".join(loads) + "\n" + "\n".join(
            f"T y{p};" for p in range(len(outs))) + "\n" + source.operation + "\n" + "\n".join(
            f"o{p}[j] = y{p};" for p in range(len(outs)))
        return (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"{_indent(chr(10).join(rows), 2)}\n"
                f"  #pragma omp simd\n"
                f"  for (int64_t j = 0; j < {width}; ++j) {{\n{_indent(body, 4)}\n  }}\n}}")

    def tensor_elementwise(self, group, outs, source):
        """An elementwise group over per-row tensors (rows of several axes, or broadcast)."""
        return self.tensor_loop(outs, self.group_inputs(group), [source.operation])

    def group_inputs(self, group):
        """The inputs of an elementwise group over per-row tensors, for :meth:`tensor_loop`:
        a per-row value's View, or ``("shared", slot, shape)``."""
        rank = len(group.outputs[0].shape)
        inputs = []
        for x in group.inputs:
            if x.key in self.inlined:
                raise Unsupported(f"{x.label()} is computed where it is read, in a loop over "
                                  f"per-row tensors")
            if row_domain(x.shape) == "vertex":
                if len(x.shape) != rank:
                    raise Unsupported(f"{x.label()} of shape {x.shape} broadcast against rows "
                                      f"of {group.outputs[0].shape}")
                inputs.append(self.view(x))
            else:
                shape = tuple(int(n) for n in x.shape)
                if len(shape) == rank:  # its first axis stands against the rows: size 1
                    if shape[0] != 1:
                        raise Unsupported(f"{x.label()} of shape {x.shape} against the rows")
                    shape = shape[1:]
                inputs.append(("shared", self.shared_slot(x), shape))
        return inputs

    def element_loads(self, group, shape):
        """Row pointers, and the statements that load ``x0, x1, ...`` of a group's inputs at
        the element ``u0, u1, ...`` of a row of ``shape``."""
        return _loads(self.group_inputs(group), shape)

    def group_of(self, ins):
        group = getattr(ins.step, "group", None)
        if group is not None:
            return group
        node = ins.step.node
        return FusedGroup([node], node.inputs, [node])

    def inline_value(self, key, column, name):
        """Statements that set ``const T name`` to column ``column`` of row i of the inlined
        value ``key``, computed from its group's inputs (the group's names prefixed by
        ``name``: plain statements, which the loop vectorises)."""
        producer, index, col, width = self.inlined[key]
        group = self.group_of(producer)
        full = _width(group.outputs[index])
        at = f"({column}) + {col}" if width > 1 else f"{col}"
        source = csource.elementwise_source(group, self.dtype)
        lines = []
        for k, x in enumerate(group.inputs):
            if x.key in self.inlined:
                lines.append(self.inline_value(x.key, at, f"{name}_x{k}"))
            elif row_domain(x.shape) == "vertex":
                view = self.view(x)
                if view.width not in (full, 1):
                    raise Unsupported(f"{x.label()} broadcast against {full} columns")
                self.inline_rows.append(f"const T *__restrict__ {name}_r{k} = {view.row('i')};")
                lines.append(f"const T {name}_x{k} = {name}_r{k}[{at if view.width == full else 0}];")
            else:
                size = int(np.prod(x.shape, dtype=np.int64))
                lines.append(f"const T {name}_x{k} = P{self.shared_slot(x)}"
                             f"[{at if size > 1 else 0}];")
        lines += [f"T {name}_y{p};" for p in range(len(group.outputs))]
        lines.append(_NAMES.sub(lambda m: f"{name}_{m.group(0)}", source.operation))
        lines.append(f"const T {name} = {name}_y{index};")
        return "\n".join(lines)

    def direct_gather(self, ins):
        """The children's rows copied straight into the rows each window of the target owns
        (into scratch for windows without rows). Returns the code and what ZERO clears."""
        child = self.child(ins.slot)
        copies, zero, scratch = [], [], None
        readers = self.readers.get(ins.target.key, ())
        if len(readers) == 1 and getattr(readers[0].step.node.op, "assembles_in_place", False):
            concat = readers[0].step.node  # the gather writes its columns of the concat
            offset = 0
            for part in concat.inputs[:[x.key for x in concat.inputs].index(ins.target.key)]:
                offset += _width(part)
            out = self.output(concat)
            dest = self.views[ins.target.key] = View(out.base, out.ld, out.col + offset,
                                                     _width(ins.target))
            self.gathered_parts.add(ins.target.key)
            return (f"{TEAM_FOR}\n"
                    f"for (int64_t i = 0; i < n; ++i) {{\n"
                    f"  const int64_t c = {child}[lo + i] < 0 ? spare : {child}[lo + i];\n"
                    f"  std::memcpy({dest.row('i')}, states + c * states_ld, "
                    f"{dest.width} * sizeof(T));\n}}"), [dest]
        for w in readers:
            node = w.step.node
            start, stop = int(node.attrs["start"]), int(node.attrs["stop"])
            if node.key in self.views:
                dest = self.views[node.key]
                self.prewritten.add(node.key)
            else:
                scratch = scratch or self.output(ins.target)
                dest = View(scratch.base, scratch.ld, scratch.col + start, stop - start)
            zero.append(dest)
            copies.append(f"  std::memcpy({dest.row('i')}, states + c * states_ld + {start}, "
                          f"{stop - start} * sizeof(T));")
        code = (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"  const int64_t c = {child}[lo + i] < 0 ? spare : {child}[lo + i];\n"
                + "\n".join(copies) + "\n}")
        return code, zero

    def concat_parts(self, node):
        parts, col = [], 0
        for part in node.inputs:
            if row_domain(part.shape) != "vertex":
                raise Unsupported(f"concat {node.label()}: a part without rows")
            view = self.view(part)
            parts.append((view, col))
            col += view.width
        self.concats[node.key] = parts
        return "// added by its parts where it is read"

    def row_work(self):
        """``(multiply-adds, elements)`` per row of a level, over the core's instructions."""
        macs = elements = 0
        for ins in self.program.core:
            for o in ins.writes:
                if row_domain(o.shape) != "vertex":
                    continue
                node = getattr(getattr(ins, "step", None), "node", None)
                if node is not None and node.op.native == "product":
                    macs += int(np.prod(node.inputs[1].shape, dtype=np.int64))
                else:
                    try:
                        elements += _width(o)
                    except Unsupported:
                        pass
        return macs, max(1, elements)

    def shared_slot(self, node):
        slot = self.shared.get(node.key)
        if slot is None:
            raise Unsupported(f"{node.label()} is made inside the level loop without rows")
        return slot.index

    def gather(self, ins):
        out = self.output(ins.target)
        child = self.child(ins.slot)
        return (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"  const int64_t c = {child}[lo + i] < 0 ? spare : {child}[lo + i];\n"
                f"  std::memcpy({out.row('i')}, states + c * states_ld, "
                f"{out.width} * sizeof(T));\n}}")

    def scatter_add(self, ins):
        """Row adds into the children's gradients: split by rows in a forest (each child has
        one parent), one thread in a DAG (two vertices of a level may share a child)."""
        child = self.child(ins.slot)
        if ins.source.key in self.concats:
            return _rows_once_per_child(self._direct_scatter(ins, child))
        return _rows_once_per_child(self._scatter(ins, child))

    def _direct_scatter(self, ins, child):
        adds = [f"  {{ const T *__restrict__ v = {view.row('i')};\n"
                f"    #pragma omp simd\n"
                f"    for (int64_t j = 0; j < {view.width}; ++j) d[{col} + j] += v[j]; }}"
                for view, col in self.concats[ins.source.key]]
        return (f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"  if ({child}[lo + i] < 0) continue;  // absent: nothing reads its gradient\n"
                f"  T *__restrict__ d = d_states + {child}[lo + i] * d_states_ld;\n"
                + "\n".join(adds) + "\n}")

    def _scatter(self, ins, child):
        values = self.view(ins.source)
        if not values.contiguous:
            raise Unsupported(f"the gradient {ins.source.label()} added into the children is "
                              f"a broadcast or strided row")
        return (f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"  if ({child}[lo + i] < 0) continue;  // absent: nothing reads its gradient\n"
                f"  T *__restrict__ d = d_states + {child}[lo + i] * d_states_ld;\n"
                f"  const T *__restrict__ v = {values.row('i')};\n"
                f"  #pragma omp simd\n"
                f"  for (int64_t j = 0; j < {values.width}; ++j) d[j] += v[j];\n}}")

    def copy_columns(self, source, target):
        if not (source.contiguous and target.contiguous):
            raise Unsupported("a copy of a broadcast or strided row")
        return (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i)\n"
                f"  std::memcpy({target.row('i')}, {source.row('i')}, "
                f"{source.width} * sizeof(T));")

    def zero(self, view):
        return (f"{TEAM_FOR}\n"
                f"for (int64_t i = 0; i < n; ++i)\n"
                f"  std::memset({view.row('i')}, 0, {view.width} * sizeof(T));")

    # --- the translation unit -----------------------------------------------------------------

    def source(self, body):
        program = self.program
        ctype = csource.C_TYPES[self.dtype]
        declare, per_level = [], []
        for s in self.slots:
            i = s.index
            if s.kind == "child":
                declare.append(f"const int64_t *__restrict__ C{i} = (const int64_t *)p[{i}];")
            elif s.kind == "batch":
                declare.append(f"T *const P{i} = (T *)p[{i}]; const int64_t L{i} = a[{2 * i}];")
                per_level.append(f"T *const B{i} = P{i} + lo * L{i};")
            else:
                declare.append(f"T *const P{i} = (T *)p[{i}];")
        level = "num_levels - 1 - s" if program.reverse else "s"
        return f"""// minicavs native level loop of program {program.name!r} (minicavs/runtime/codegen.py)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
using std::exp; using std::log; using std::tanh; using std::sqrt; using std::pow;
typedef {ctype} T;
static int8_t panel_rows[{2 * len(ROW_COUNTS) * max(1, len(self.slots))}];  // see panels_run
extern "C" void minicavs_set_panel_rows(const int8_t *t) {{ std::memcpy(panel_rows, t, sizeof panel_rows); }}
// A product's weight packed into panels for this call (runtime/native.py), or none: after the
// slots' (ld, transposed) pairs in the loop's a[].
#define PANELS(slot) ((const T *)(intptr_t)a[2 * {len(self.slots)} + (slot)])
{_GEMM[self.blas]}
{_PROFILE.format(n=len(program.core)) if self.profile else ""}
extern "C" void {ENTRY}(int64_t num_levels, int64_t first, int64_t stop,
                        const int64_t *offsets, const signed char *plan, void *const *p,
                        const int64_t *a, int64_t spare, T *states, int64_t states_ld,
                        T *d_states, int64_t d_states_ld, int64_t threads, int64_t forest,
                        int64_t split_rows, int64_t split_macs) {{
{_indent(chr(10).join(declare), 2)}
  // Each wide level runs on a team: every instruction's rows (or a product's columns) are
  // split between its threads, each calling a one-thread gemm; the implicit barrier of each
  // loop orders the instructions. The BLAS runs one thread per call while the team splits the products (its setter is
  // process-wide in a pthreads OpenBLAS: set once here, restored after the team).
  const bool split = threads > 1 && blas_threads != nullptr;
  const int blas_before = split ? blas_threads(1) : 0;
  for (int64_t s = first; s < stop; ++s) {{
    const int64_t t = {level};
    const int64_t lo = offsets[t], n = offsets[t + 1] - lo;
    const signed char *act = plan + t * {len(program.core)};
    // A level of fewer rows than split_rows runs on one thread: its work costs less than
    // waking the team (measured here: runtime/native.py, cpu/calibrate.py).
    #pragma omp parallel num_threads((int)threads) if (split && n >= split_rows)
    {{
{_indent(chr(10).join(per_level), 4)}
{chr(10).join(body)}
    }}
  }}
  if (split) blas_threads(blas_before);
}}
"""


# A profiling loop's seconds per instruction, read (and cleared) by minicavs_profile.
_PROFILE = """static double minicavs_seconds[{n}];
extern "C" void minicavs_profile(double *out) {{
  for (int k = 0; k < {n}; ++k) {{ out[k] = minicavs_seconds[k]; minicavs_seconds[k] = 0; }}
}}"""


# The gemm the loop calls, per interface (blas.py): row-major out (n x m, row stride ldo) =
# x (n x k, stride ldx) . w (k x m, stride ldw; or its transpose stored, m x k).
# Or the library's panel kernel (cpu/kernel_source.py) over the weight packed once for the call:
# the BLAS packs all of w again at every call, each level's and each thread's, which for a
# level of a few rows costs more than the product, and reads a transposed w (∂F's G·Uᵀ) slowly
# (one thread, 640 x 256 Uᵀ, Zen 4: 8 rows 34 us against OpenBLAS's 106, 64 rows 196 against
# 274, 512 rows 1.47 ms against 1.69). Neither wins everywhere: OpenBLAS's small-matrix kernels
# take 1-4 rows in half the panels' time, and an AVX2 CPU has half the registers. So each
# product's route, per n up to EXACT_ROWS and per power of two of n above it up to LAST_ROWS
# (more: LAST_ROWS's), is measured on the machine (runtime/native.py, cpu/calibrate.py) and
# handed to the loop before its call (minicavs_set_panel_rows).
LAST_ROWS = 512
EXACT_ROWS = native_products.EXACT_ROWS
EXACT_BITS = native_products.bucket(EXACT_ROWS)
ROW_COUNTS = tuple(range(1, EXACT_ROWS + 1)) + tuple(  # each entry's n, as measured
    1 << e for e in range(EXACT_BITS + 1, native_products.bucket(LAST_ROWS) + 1))
PANELS_SOURCE = """// The library's panel kernel: panels p0 to p1 of out = x . packed w (add: out += ...).
typedef void (*panels_t)(const T *, int64_t, const T *, int64_t, int64_t, int64_t, T *, int64_t,
                         int64_t, int64_t, int);
static panels_t panels;
static int64_t panel_width = 1;
extern "C" void minicavs_set_panels(void *f, int64_t width) {
  panels = (panels_t)f;
  panel_width = width;
}
// panel_rows[slot][transposed][entry of n]: whether the panels run that product; the entry of n
// is n - 1 up to EXACT_ROWS, then one per power of two up to LAST_ROWS (codegen.ROW_COUNTS).
static inline bool panels_run(int64_t slot, int64_t w_transposed, int64_t n) {
  const int64_t entry = n <= EXACT_ROWS ? (n < 1 ? 0 : n - 1)
      : n > LAST_ROWS ? ROW_ENTRIES - 1
      : EXACT_ROWS - 1 + (64 - __builtin_clzll((uint64_t)(n - 1))) - EXACT_BITS;
  return panel_rows[(slot * 2 + (w_transposed != 0)) * ROW_ENTRIES + entry] != 0;
}"""
_CBLAS = """typedef void (*gemm_t)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);
typedef void (*gemv_t)(int, int, I, I, T, const T *, I, const T *, I, T, T *, I);
static gemm_t gemm;
static gemv_t gemv;  // (one row: a gemm packs all of w for it; NULL: the gemm)
extern "C" void minicavs_set_gemm(void *f, void *v) {{ gemm = (gemm_t)f; gemv = (gemv_t)v; }}
static inline void gemm_rows(int64_t n, int64_t m, int64_t k, const T *w, int64_t ldw,
                             int64_t w_transposed, const T *x, int64_t ldx, T *out, int64_t ldo,
                             T beta) {{  // out = x.w + beta out (beta 0 or 1)
  if (n == 1 && gemv) {{  // out' = w' x' (w k x m), or w x' (w stored m x k)
    gemv(101, w_transposed ? 111 : 112, (I)(w_transposed ? m : k), (I)(w_transposed ? k : m),
         (T)1, w, (I)ldw, x, 1, beta, out, 1);
    return;
  }}
  gemm(101, 111, w_transposed ? 112 : 111, (I)n, (I)m, (I)k, (T)1, x, (I)ldx, w, (I)ldw,
       beta, out, (I)ldo);  // CblasRowMajor, CblasNoTrans, CblasTrans
}}"""
_FORTRAN = """typedef void (*gemm_t)(const char *, const char *, const int *, const int *, const int *,
                       const T *, const T *, const int *, const T *, const int *, const T *,
                       T *, const int *);
typedef void (*gemv_t)(const char *, const int *, const int *, const T *, const T *, const int *,
                       const T *, const int *, const T *, T *, const int *);
static gemm_t gemm;
static gemv_t gemv;  // (one row: a gemm packs all of w for it; NULL: the gemm)
extern "C" void minicavs_set_gemm(void *f, void *v) { gemm = (gemm_t)f; gemv = (gemv_t)v; }
// Row-major out = x.w is column-major out' = w'.x': one Fortran gemm (one row: a gemv).
static inline void gemm_rows(int64_t n, int64_t m, int64_t k, const T *w, int64_t ldw,
                             int64_t w_transposed, const T *x, int64_t ldx, T *out, int64_t ldo,
                             T beta) {  // out = x.w + beta out (beta 0 or 1)
  const int rows = (int)n, cols = (int)m, inner = (int)k;
  const int lw = (int)ldw, lx = (int)ldx, lo = (int)ldo;
  const T one = 1;
  if (rows == 1 && gemv) {  // w (k x m) is column-major m x k: out' = w x'; stored m x k: w' x'
    const int step = 1, vrows = w_transposed ? inner : cols, vcols = w_transposed ? cols : inner;
    gemv(w_transposed ? "T" : "N", &vrows, &vcols, &one, w, &lw, x, &step, &beta, out, &step);
    return;
  }
  gemm(w_transposed ? "T" : "N", "N", &cols, &rows, &inner, &one, w, &lw, x, &lx, &beta, out,
       &lo);
}"""
# The team's gemm: the longer side of the product's out split between the threads (one-thread
# gemms: the loop sets the BLAS to one thread for the call, ``openblas_set_num_threads_local``),
# or one thread. Each thread reads all of the operand along the other side — all of x's rows for
# a split by columns, all of w for a split by rows — so the split takes the side whose other
# operand is the smaller (Tree-FC's 8192 x 512 level rows times a 512 x 256 w: by rows).
_TEAM = """typedef int (*blas_threads_t)(int);  // sets the BLAS's threads, returns the old count
static blas_threads_t blas_threads;
extern "C" void minicavs_set_blas_threads(void *f) { blas_threads = (blas_threads_t)f; }
// A product of fewer than split_macs multiply-adds runs on one thread (measured: native.py).
// On the panels (where the loop was handed w packed and they were measured faster for n rows)
// the threads take whole panels of the out's columns; on the BLAS, the out's longer side.
static inline void gemm_team(int64_t slot, int64_t n, int64_t m, int64_t k, const T *w,
                             int64_t ldw, int64_t w_transposed, const T *x, int64_t ldx, T *out,
                             int64_t ldo, int64_t split_macs, const T *packed, T beta = 0) {
  const int64_t team = omp_get_num_threads();
  const bool alone = team == 1 || n * m * k < split_macs;
  if (packed != nullptr && panels != nullptr && panels_run(slot, w_transposed, n)) {
    const int64_t count = (m + panel_width - 1) / panel_width;
    if (alone || count < team) {
      #pragma omp single
      panels(x, ldx, packed, n, m, k, out, ldo, 0, count, beta != 0);
      return;
    }
    const int64_t block = (count + team - 1) / team, p0 = omp_get_thread_num() * block;
    if (p0 < count)
      panels(x, ldx, packed, n, m, k, out, ldo, p0, p0 + block < count ? p0 + block : count,
             beta != 0);
    #pragma omp barrier
    return;
  }
  const bool by_rows = n > m;
  const int64_t side = by_rows ? n : m;
  if (alone || side < 32 * team) {
    #pragma omp single
    gemm_rows(n, m, k, w, ldw, w_transposed, x, ldx, out, ldo, beta);
    return;
  }
  if (by_rows) {
    const int64_t block = (n + team - 1) / team;
    const int64_t r0 = omp_get_thread_num() * block, r1 = r0 + block < n ? r0 + block : n;
    if (r1 > r0)
      gemm_rows(r1 - r0, m, k, w, ldw, w_transposed, x + r0 * ldx, ldx, out + r0 * ldo, ldo,
                beta);
  } else {
    const int64_t block = ((m + team - 1) / team + 15) / 16 * 16;
    const int64_t c0 = omp_get_thread_num() * block, c1 = c0 + block < m ? c0 + block : m;
    if (c1 > c0)
      gemm_rows(n, c1 - c0, k, w_transposed ? w + c0 * ldw : w + c0, ldw, w_transposed, x,
                ldx, out + c0, ldo, beta);
  }
  #pragma omp barrier
}"""
_PRELUDE = (f"const int64_t LAST_ROWS = {LAST_ROWS}, EXACT_ROWS = {EXACT_ROWS}, "
            f"EXACT_BITS = {EXACT_BITS}, ROW_ENTRIES = {len(ROW_COUNTS)};\n"
            + PANELS_SOURCE + "\n")
_GEMM = {"cblas64": _PRELUDE + "typedef int64_t I;\n" + _CBLAS.replace("{{", "{").replace("}}", "}")
         + "\n" + _TEAM,
         "cblas32": _PRELUDE + "typedef int I;\n" + _CBLAS.replace("{{", "{").replace("}}", "}")
         + "\n" + _TEAM,
         "fortran32": _PRELUDE + _FORTRAN + "\n" + _TEAM}


def _rows_once_per_child(loop):
    """A loop of adds into children's rows: split by rows in a forest, one thread in a DAG."""
    return (f"if (forest) {{\n{_indent(TEAM_FOR, 2)}\n{_indent(loop, 2)}\n}} else {{\n"
            f"  #pragma omp single\n  {{\n{_indent(loop, 4)}\n  }}\n}}")


def _indent(text, spaces):
    pad = " " * spaces
    return "\n".join(pad + line if line else line for line in text.splitlines())
