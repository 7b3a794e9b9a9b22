"""One growing step: F's Program run on the frontier of every sample, as one batching task,
through the runtime's call and driver like any other call of F — in row chunks when the
frontier does not fit the memory budget beside what the growth keeps."""

import numpy as np

from ...errors import OutOfMemoryError
from ...runtime import call, driver, memory


class FrontierRows:
    """A frontier as the interpreter reads a batch (the interface of ``BatchIndices``): one
    level of ``n`` rows whose child 0 is a row of the parents' states (-1 at a root: the spare
    zero row)."""

    num_levels, num_edges, is_forest = 1, 0, True

    def __init__(self, xp, parent_rows, names):
        put = (lambda a: a) if xp is np else (lambda a: xp.asarray(a.astype(np.int32)))
        self.num_vertices = self.widest = n = len(parent_rows)
        self.order = self.row_of = put(np.arange(n))
        self._parents = put(parent_rows)
        self.level_offsets = np.array([0, n], dtype=np.int64)  # (the native loop reads these)
        self.edge_level_offsets = np.zeros(2, dtype=np.int64)
        present = np.flatnonzero(parent_rows >= 0)
        self._hull = (int(present[0]), int(present[-1]) + 1) if present.size else (0, 0)
        self._names = names  # row -> "sample s, vertex v"

    def size(self, rows):
        return self.num_vertices if rows == "V" else 0

    def vertices(self, t):
        return (0, self.num_vertices)

    def edges(self, t):
        return (0, 0)

    def level_windows(self, domain):
        return [(0, self.num_vertices) if domain == "vertex" else (0, 0)]

    def has_child(self, slot, t):
        return slot == 0 and self._hull[1] > self._hull[0]

    def has_child_levels(self, slot):
        return [self.has_child(slot, 0)]

    def hull(self, slot):
        return self._hull if slot == 0 else (0, 0)

    def strided(self, slot, t):
        return None

    def child_rows(self, slot, window):
        return self._parents

    def slot_rows(self, slot):
        return self._parents

    def vertex_name(self, row):
        return self._names(row)


def run_frontier(f, xp, pull, parent_rows, parent_states, names):
    """F's Program on one frontier: returns (states, outputs, what the next frontier gathers)
    in frontier order. ``parent_states`` holds the previous frontier's states plus one zero row
    (what a root gathers): the scattered state's own buffer, whose spare row stays zero. The
    buffers are fresh (not pooled): the next step reads this one's."""
    rows = FrontierRows(xp, parent_rows, names)
    states = parent_states if parent_states is not None else \
        xp.zeros((1,) + f.scatter_shape, f.dtype)
    params = [tensor._array for tensor in f.params]  # (no .data: handing it out is a write)
    part = call.bind_forward(f.executable, xp, rows, params, pull, states=states)
    driver.run([part], xp)
    return part.env[f.program.graph.outputs[0].key], part.output, part.scattered


def run_step(f, xp, pull, parent_rows, parent_states, names, kept, step):
    """:func:`run_frontier` within the memory budget: the frontier's rows are independent (each
    reads its parent's state only), so a frontier too large for the budget left beside
    ``kept`` (the bytes of everything grown so far) runs in chunks of rows that fit, and the
    chunks' states make the next step's parent buffer. Raises :class:`OutOfMemoryError`
    before allocating when not even one row fits."""
    n = len(parent_rows)
    forward = f.memory_model.forward
    room = memory.memory_budget() - kept
    if forward.at((n, 0, n, 0)) <= room:
        return run_frontier(f, xp, pull, parent_rows, parent_states, names)
    per_row = forward.at((1, 0, 1, 0)) - forward.at((0, 0, 0, 0))
    rows = int((room - forward.at((0, 0, 0, 0))) // max(per_row, 1))
    if rows < 1:
        raise OutOfMemoryError(
            f"grow: step {step} (a frontier of {n:,} vertices) of vertex function {f.name!r} "
            f"needs about {memory.text(forward.at((1, 0, 1, 0)))} for one vertex, beside the "
            f"{memory.text(kept)} the growth keeps of the vertices grown so far, more than the "
            f"memory budget of {memory.text(memory.memory_budget())}. Lower max_vertices, grow "
            f"fewer samples at once, or raise the budget (mc.set_memory_budget, "
            f"MINICAVS_MEMORY_BUDGET) if more memory is free.")
    states, pushes, scattered = [], [], []
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        chunk_pull = None if pull is None else pull[lo:hi]
        state, push, buffer = run_frontier(f, xp, chunk_pull, parent_rows[lo:hi],
                                           parent_states, lambda i, lo=lo: names(lo + i))
        states.append(state)
        pushes.append(push)
        scattered.append(buffer[:hi - lo])
    zero_row = xp.zeros((1,) + f.scatter_shape, f.dtype)  # (what a root of the next step reads)
    join = lambda parts: parts[0] if len(parts) == 1 else xp.concatenate(parts)  # noqa: E731
    return (join(states), None if pushes[0] is None else join(pushes),
            xp.concatenate(scattered + [zero_row]))
