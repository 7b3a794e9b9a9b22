"""Debug mode inside the runtime: the first NaN or infinity an instruction of F or ∂F makes.

Only used when debug mode is on (``mc.debug()``, ``MINICAVS_DEBUG=1``; ``autodiff/debug.py``),
so the normal path of the interpreter pays nothing for it.
"""

from .. import backend
from ..autodiff import debug
from ..errors import NonFiniteError
from ..ops.batching import instantiate, row_domain
from .program import Compute


class FiniteCheck:
    """Debug mode (``autodiff/debug.py``): after each instruction, its outputs are checked for
    NaN and infinity; the first one raises :class:`NonFiniteError` naming the program (F or
    ∂F), the op and the user's line, the level, and the sample and vertex of the first bad
    row. F's pulled input is checked before the run."""

    def __init__(self, program, rows, env):
        self.program, self.rows = program, rows
        pulled = [n for n in program.graph.inputs if n.role == "pull" and n.key in env]
        for n in pulled:
            self._check(n, env[n.key], "the pulled input", None, 0)

    def __call__(self, ins, values, t=None, window=None):
        if not isinstance(ins, Compute):
            return  # gathers copy checked states; scatter-adds add checked gradients
        for o in ins.writes:
            start = window[row_domain(o.shape)][0] if window and row_domain(o.shape) else 0
            array = values[o.key]
            group = getattr(ins.step, "group", None)
            if group is not None and debug.first_non_finite(array) is not None:
                o, array = _first_bad_member(group, values, window)  # what the kernel hid
            self._check(o, array, f"op '{o.op.name}'", t, start)

    def _check(self, symbol, array, what, t, start):
        found = debug.first_non_finite(array)
        if found is None:
            return
        index, summary = found
        program = self.program
        if self.rows is None:  # (autobatch's batched kernels name themselves: signature.py)
            name = program.name or ""
            where = name if name.startswith("an mc.autobatch") else \
                f"the backward of {name[2:-1]}" if name.startswith("d(an mc.autobatch") else \
                f"static function {program.name!r}"
        elif program.reverse:
            where = f"∂F (the backward) of vertex function {program.name[2:-1]!r}"
        else:
            where = f"vertex function {program.name!r}"
        place = [f"level {t}"] if t is not None else []
        domain = row_domain(symbol.shape)
        if self.rows is not None and domain and index:
            row = start + index[0]
            place.append(self.rows.vertex_name(row) if domain == "vertex"
                         else self.rows.edge_name(row))
        at = f" ({', '.join(place)})" if place else ""
        verb = "holds" if symbol.kind == "input" else "produced"
        raise NonFiniteError(f"debug mode: {what} in {where} {verb} a non-finite value{at}: "
                             f"{summary}" + debug.location_text(symbol.where))


def _first_bad_member(group, values, window):
    """The first member of a fused group whose value is not finite, and that value: the group
    evaluated again op by op (only when its output was found bad, so never on the normal
    path)."""
    xp = backend.get_array_module(*[values[x.key] for x in group.inputs])
    n = window["vertex"][1] - window["vertex"][0] if window else 0
    e = window["edge"][1] - window["edge"][0] if window else 0
    member_values = {}
    for m in group.members:
        args = [member_values.get(x.key, values.get(x.key)) for x in m.inputs]
        attrs = {k: instantiate(v, n, e) for k, v in m.attrs.items()}
        member_values[m.key] = m.op.forward(xp, *args, **attrs)
        if debug.first_non_finite(member_values[m.key]) is not None:
            return m, member_values[m.key]
    last = group.outputs[-1]
    return last, values[last.key]
