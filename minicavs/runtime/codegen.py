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
  *same C* the CUDA ElementwiseKernels run (``cuda/fusion.elementwise_source``);
* a matrix product (``Op.native == "product"``) of per-row ``X`` and a shared ``W``: one BLAS
  gemm (``blas.py``), its transposition read from ``W``'s strides at call time;
* a concat (``Op.assembles_in_place``): nothing if its parts wrote its columns, else column copies.

A program holding anything else (another op, edge lists, a per-level sum) raises
:class:`Unsupported`, with the reason; that program stays on the interpreter.
"""

import re
from dataclasses import dataclass

import numpy as np

from ..autodiff.analysis import FusedGroup
from ..cuda import fusion
from ..ops.batching import row_domain
from .plans import RUN, SKIP, ZERO
from .program import Compute, Gather

ACTIONS = {SKIP: 0, RUN: 1, ZERO: 2}  # plan codes, as the generated loop reads them
ENTRY = "minicavs_levels"
# Multiply-adds of a level's product from which its columns are split between the team's
# threads (each calls a one-thread gemm on its block); below, one thread runs it.
GEMM_SPLIT_MIN = 1 << 16
# Rows of a level from which the team may split it, and the work (multiply-adds and elements,
# rows x the program's per-row work) from which it does: below, one thread runs the level.
SPLIT_ROWS = 64
SPLIT_WORK = 1 << 23
# One loop per row: for a split by rows, a row-parallel loop the team shares.
TEAM_FOR = "#pragma omp for schedule(static)"


# The names a fused group's C uses (cuda/fusion.py): inputs x0.., temporaries t0.., outputs y0..
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
    """Row i of a per-row value on the current level: ``base + i * ld + col``."""

    base: str
    ld: str
    col: int
    width: int

    def row(self, i):
        return f"({self.base} + ({i}) * {self.ld} + {self.col})"


@dataclass(frozen=True)
class LevelLoop:
    """The generated source and what its arguments are."""

    source: str
    dtype: np.dtype
    slots: tuple
    num_core: int
    actions: dict = None  # RUN/ZERO/SKIP -> the code the loop reads


def generate(program, blas="cblas64"):
    """The :class:`LevelLoop` of ``program``'s core, calling a gemm of interface ``blas``
    (``blas.py``); raises :class:`Unsupported`."""
    return _Generator(program, blas).loop()


def _width(node):
    shape = node.shape
    if len(shape) == 1:
        return 1
    if len(shape) == 2 and isinstance(shape[1], (int, np.integer)):
        return int(shape[1])
    raise Unsupported(f"per-row value {node.label()} has shape {shape} (the native loop takes "
                      f"rows of one axis)")


class _Generator:
    def __init__(self, program, blas):
        self.program, self.blas = program, blas
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

    def _dtype(self):
        touched = [x for ins in self.program.core for x in (*ins.reads, *ins.writes)]
        dtypes = {np.dtype(x.dtype) for x in touched}
        if len(dtypes) != 1 or next(iter(dtypes)) not in fusion.COMPUTE_DTYPES:
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
                self.views[key] = View(f"B{slot.index}", f"L{slot.index}", 0, _width(node))
            else:
                self.shared[key] = self._slot("shared", node=node)
        for ins in core:
            for x in ins.reads:
                self.readers.setdefault(x.key, []).append(ins)
        body = [self.instruction(k, ins) for k, ins in enumerate(core)]
        return LevelLoop(self.source(body), self.dtype, tuple(self.slots), len(core), ACTIONS)

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
            view = self.views[node.key] = View(f"P{slot.index}", str(width), 0, width)
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
        if zero_views is None:
            zero_views = [self.views[o.key] for o in ins.writes if o.key in self.views]
        zero = "\n".join(self.zero(v) for v in zero_views)
        return (f"    // [{k}] {note}\n"
                f"    if (act[{k}] == {ACTIONS[RUN]}) {{\n{_indent(run, 6)}\n    }}"
                + (f" else if (act[{k}] == {ACTIONS[ZERO]}) {{\n{_indent(zero, 6)}\n    }}"
                   if zero else ""))

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
        if op.assembles_in_place:
            return self.concat(node, step.attrs, ins.aliased)
        raise Unsupported(f"op '{op.name}' ({node.label()}) has no native form in a level loop")

    def window(self, node, attrs):
        x = node.inputs[0]
        if row_domain(x.shape) != "vertex" or len(x.shape) != 2 or attrs["axis"] not in (1, -1):
            raise Unsupported(f"slice_axis {node.label()}: only column windows of per-row "
                              f"matrices run natively")
        start, stop = int(attrs["start"]), int(attrs["stop"])
        if x.key in self.inlined:  # a window of a value computed where it is read
            producer, index, col, _ = self.inlined[x.key]
            self.inlined[node.key] = (producer, index, col + start, stop - start)
            return "// a window of a value computed where it is read"
        if node.key in self.prewritten:
            return "// the gather wrote its rows"
        source = self.view(x)
        window = View(source.base, source.ld, source.col + start, stop - start)
        if node.key in self.views:  # it has rows of its own (a buffer): copy the columns
            return self.copy_columns(window, self.views[node.key])
        self.views[node.key] = window
        return "// a view: nothing to do"

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
            code.append(self.copy_columns(view, View(out.base, out.ld, out.col + col,
                                                     view.width)))
            col += view.width
        return "\n".join(code)

    def product(self, node):
        x, w = node.inputs
        if row_domain(x.shape) != "vertex" or len(x.shape) != 2 or row_domain(w.shape) or \
                len(w.shape) != 2 or w.key not in self.shared:
            raise Unsupported(f"matmul {node.label()}: only per-row X times a shared matrix W "
                              f"runs natively")
        a, out = self.view(x), self.output(node)
        k, m = (int(d) for d in w.shape)
        s = self.shared[w.key].index
        return (f"gemm_team(n, {m}, {k}, P{s}, a[{2 * s}], a[{2 * s + 1}], "
                f"{a.row(0)}, {a.ld}, {out.row(0)}, {out.ld});")

    def elementwise(self, group):
        source = fusion.elementwise_source(group, self.dtype)
        outs = [self.output(o) for o in group.outputs]
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
        source = fusion.elementwise_source(group, self.dtype)
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
        for w in self.readers.get(ins.target.key, ()):
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
        """Multiply-adds and elements per row of a level, over the core's instructions."""
        work = 0
        for ins in self.program.core:
            for o in ins.writes:
                if row_domain(o.shape) != "vertex":
                    continue
                node = getattr(getattr(ins, "step", None), "node", None)
                if node is not None and node.op.native == "product":
                    work += int(np.prod(node.inputs[1].shape, dtype=np.int64))
                else:
                    try:
                        work += _width(o)
                    except Unsupported:
                        pass
        return max(1, work)

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
        return (f"for (int64_t i = 0; i < n; ++i) {{\n"
                f"  if ({child}[lo + i] < 0) continue;  // absent: nothing reads its gradient\n"
                f"  T *__restrict__ d = d_states + {child}[lo + i] * d_states_ld;\n"
                f"  const T *__restrict__ v = {values.row('i')};\n"
                f"  #pragma omp simd\n"
                f"  for (int64_t j = 0; j < {values.width}; ++j) d[j] += v[j];\n}}")

    def copy_columns(self, source, target):
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
        ctype = fusion.C_TYPES[self.dtype]
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
{_GEMM[self.blas]}
extern "C" void {ENTRY}(int64_t num_levels, int64_t first, int64_t stop,
                        const int64_t *offsets, const signed char *plan, void *const *p,
                        const int64_t *a, int64_t spare, T *states, int64_t states_ld,
                        T *d_states, int64_t d_states_ld, int64_t threads, int64_t forest) {{
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
    // A level of few rows runs on one thread: its work costs less than waking the team.
    #pragma omp parallel num_threads((int)threads) if (split && n >= {SPLIT_ROWS} && n * {self.row_work()} >= {SPLIT_WORK})
    {{
{_indent(chr(10).join(per_level), 4)}
{chr(10).join(body)}
    }}
  }}
  if (split) blas_threads(blas_before);
}}
"""


# The gemm the loop calls, per interface (blas.py): row-major out (n x m, row stride ldo) =
# x (n x k, stride ldx) . w (k x m, stride ldw; or its transpose stored, m x k).
_CBLAS = """typedef void (*gemm_t)(int, int, int, I, I, I, T, const T *, I, const T *, I, T, T *, I);
static gemm_t gemm;
extern "C" void minicavs_set_gemm(void *f) {{ gemm = (gemm_t)f; }}
static inline void gemm_rows(int64_t n, int64_t m, int64_t k, const T *w, int64_t ldw,
                             int64_t w_transposed, const T *x, int64_t ldx, T *out,
                             int64_t ldo) {{
  gemm(101, 111, w_transposed ? 112 : 111, (I)n, (I)m, (I)k, (T)1, x, (I)ldx, w, (I)ldw,
       (T)0, out, (I)ldo);  // CblasRowMajor, CblasNoTrans, CblasTrans
}}"""
_FORTRAN = """typedef void (*gemm_t)(const char *, const char *, const int *, const int *, const int *,
                       const T *, const T *, const int *, const T *, const int *, const T *,
                       T *, const int *);
static gemm_t gemm;
extern "C" void minicavs_set_gemm(void *f) { gemm = (gemm_t)f; }
// Row-major out = x.w is column-major out' = w'.x': one Fortran gemm.
static inline void gemm_rows(int64_t n, int64_t m, int64_t k, const T *w, int64_t ldw,
                             int64_t w_transposed, const T *x, int64_t ldx, T *out,
                             int64_t ldo) {
  const int rows = (int)n, cols = (int)m, inner = (int)k;
  const int lw = (int)ldw, lx = (int)ldx, lo = (int)ldo;
  const T one = 1, zero = 0;
  gemm(w_transposed ? "T" : "N", "N", &cols, &rows, &inner, &one, w, &lw, x, &lx, &zero, out,
       &lo);
}"""
# The team's gemm: the product's columns split between the threads (one-thread gemms: the loop
# sets the BLAS to one thread for the call, ``openblas_set_num_threads_local``), or one thread.
_TEAM = """typedef int (*blas_threads_t)(int);  // sets the BLAS's threads, returns the old count
static blas_threads_t blas_threads;
extern "C" void minicavs_set_blas_threads(void *f) { blas_threads = (blas_threads_t)f; }
static inline void gemm_team(int64_t n, int64_t m, int64_t k, const T *w, int64_t ldw,
                             int64_t w_transposed, const T *x, int64_t ldx, T *out,
                             int64_t ldo) {
  const int64_t team = omp_get_num_threads();
  if (team == 1 || n * m * k < %d || m < 32 * team) {
    #pragma omp single
    gemm_rows(n, m, k, w, ldw, w_transposed, x, ldx, out, ldo);
    return;
  }
  const int64_t block = ((m + team - 1) / team + 15) / 16 * 16;
  const int64_t c0 = omp_get_thread_num() * block, c1 = c0 + block < m ? c0 + block : m;
  if (c1 > c0)
    gemm_rows(n, c1 - c0, k, w_transposed ? w + c0 * ldw : w + c0, ldw, w_transposed, x, ldx,
              out + c0, ldo);
  #pragma omp barrier
}""" % GEMM_SPLIT_MIN
_GEMM = {"cblas64": "typedef int64_t I;\n" + _CBLAS.replace("{{", "{").replace("}}", "}") + "\n" + _TEAM,
         "cblas32": "typedef int I;\n" + _CBLAS.replace("{{", "{").replace("}}", "}") + "\n" + _TEAM,
         "fortran32": _FORTRAN + "\n" + _TEAM}


def _rows_once_per_child(loop):
    """A loop of adds into children's rows: split by rows in a forest, one thread in a DAG."""
    return (f"if (forest) {{\n{_indent(TEAM_FOR, 2)}\n{_indent(loop, 2)}\n}} else {{\n"
            f"  #pragma omp single\n  {{\n{_indent(loop, 4)}\n  }}\n}}")


def _indent(text, spaces):
    pad = " " * spaces
    return "\n".join(pad + line if line else line for line in text.splitlines())
