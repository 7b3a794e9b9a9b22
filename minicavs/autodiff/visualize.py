"""Seeing a graph: Graphviz DOT text and an annotated text summary.

``graph.to_dot()`` draws every node with its op (or kind) and shape: inputs as house shapes,
parameters as 3-D boxes, constants as notes, ops as rounded boxes. What the runtime decided
about a graph is drawn when given: fused groups (``runtime/analysis.fusion_groups``, or a
Program's ``groups``) as dashed clusters ("fused kernel k"), the eager/core/lazy classes of
``dependency_classes`` as the colours of Cavs Fig. 7 (eager green, lazy orange, the
gather→scatter core white) with a legend. Render with ``dot -Tsvg graph.dot -o graph.svg``.

Shapes and attributes may hold a task's symbolic sizes (the vertex runtime records F with a
leading axis of symbolic length); they are shown by name, ``(V, 4)``, as everywhere a person
reads a shape (``registry.describe``).
"""

from ..ops.batching import dim_text, has_symbolic_size
from ..ops.registry import describe

# The runtime's node classes (runtime/analysis.py), coloured as in Fig. 7.
CLASS_COLOURS = {"eager": "#b7e1cd", "core": "#ffffff", "lazy": "#f9cb9c"}
PARAM_COLOUR = "#d9d2e9"
CONST_COLOUR = "#eeeeee"
INPUT_COLOUR = "#ffffff"


def _format_attr(value):
    if isinstance(value, tuple) and has_symbolic_size(value):
        return describe(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return dim_text(value)
    return str(value)


def node_text(node):
    """A short description: the op with its attributes, or the kind and name of a leaf."""
    if node.kind == "op":
        attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in node.attrs.items())
        return f"{node.op.name}({attrs})" if attrs else node.op.name
    if node.kind == "const":
        value = node.value
        if getattr(value, "size", 2) == 1:
            return f"const {value.reshape(()).item():g}"
        return "const"
    role = node.role if not isinstance(node.role, tuple) else " ".join(map(str, node.role))
    role = f" [{role}]" if role else ""
    return f"{node.kind} {node.name or ''}".strip() + role


def _quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _node_style(node, cls):
    if node.kind == "param":
        return {"shape": "box3d", "style": "filled", "fillcolor": PARAM_COLOUR}
    if node.kind == "const":
        return {"shape": "note", "style": "filled", "fillcolor": CONST_COLOUR, "fontsize": "9"}
    fill = CLASS_COLOURS[cls] if cls else INPUT_COLOUR
    if node.kind == "input":
        return {"shape": "invhouse", "style": "filled", "fillcolor": fill}
    return {"shape": "box", "style": "rounded,filled", "fillcolor": fill}


def to_dot(graph, classes=None, groups=None, title=None):
    """Graphviz DOT text for ``graph``.

    ``classes``: a ``dependency_classes`` result, to colour nodes eager/core/lazy.
    ``groups``: the fused groups to draw as clusters (objects with ``members``), or None.
    """
    groups = groups or []
    index = {n.key: i for i, n in enumerate(graph.nodes)}
    group_of = {m.key: k for k, g in enumerate(groups) for m in g.members}
    name = title or graph.name or "graph"
    lines = [f"digraph {_quote(name)} {{",
             f"  label={_quote(name)}; labelloc=t; rankdir=TB;",
             '  node [fontname="Helvetica", fontsize=10];',
             '  edge [color="#555555", arrowsize=0.6];']

    def declare(n, indent="  "):
        cls = classes[n] if classes is not None else None
        label = f"{node_text(n)}\n{describe(n.shape)}"
        if n.dtype.kind != "f":
            label += f" {n.dtype}"
        attrs = dict(_node_style(n, cls), label=label)
        if n.where:
            attrs["tooltip"] = f"{n.where[0]}:{n.where[1]}"
        body = ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items())
        return f"{indent}n{index[n.key]} [{body}];"

    for n in graph.nodes:
        if n.key not in group_of:
            lines.append(declare(n))
    for k, g in enumerate(groups):
        lines.append(f"  subgraph cluster_fused_{k} {{")
        lines.append(f"    label={_quote(f'fused kernel {k} ({len(g)} ops)')}; "
                     f'style="rounded,dashed"; color="#3c78d8"; fontcolor="#3c78d8";')
        lines.extend(declare(m, "    ") for m in g.members)
        lines.append("  }")
    for n in graph.nodes:
        for x in n.inputs:
            lines.append(f"  n{index[x.key]} -> n{index[n.key]};")
    for i, o in enumerate(graph.outputs):
        lines.append(f'  out{i} [label={_quote(f"output {i}")}, shape=plaintext];')
        lines.append(f"  n{index[o.key]} -> out{i};")
    if classes is not None:
        lines.append("  subgraph cluster_legend {")
        lines.append('    label="legend"; style=rounded; color="#999999";')
        for kind in CLASS_COLOURS:
            lines.append(f"    legend_{kind} [label={_quote(kind + ' operator')}, shape=box, "
                         f'style="rounded,filled", fillcolor={_quote(CLASS_COLOURS[kind])}];')
        lines.append(f'    legend_param [label="parameter", shape=box3d, style=filled, '
                     f"fillcolor={_quote(PARAM_COLOUR)}];")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def summary(graph, classes=None, groups=None):
    """One line per node, as ``Graph.summary()``, plus the node's class (eager/core/lazy) when
    ``classes`` is given and its fused group (``g0``, ``g1``, ...) when ``groups`` is given."""
    index = {n.key: i for i, n in enumerate(graph.nodes)}
    group_of = {m.key: k for k, g in enumerate(groups or []) for m in g.members}
    outputs = {}
    for i, o in enumerate(graph.outputs):
        outputs.setdefault(o.key, []).append(str(i))
    lines = [f"graph {graph.name or ''}: {len(graph.inputs)} inputs, {len(graph.params)} params, "
             f"{len(graph.op_nodes())} ops, {len(graph.outputs)} outputs"
             + (f", {len(groups)} fused groups" if groups else "")]
    for i, n in enumerate(graph.nodes):
        args = ", ".join(f"%{index[x.key]}" for x in n.inputs)
        what = node_text(n)
        if n.kind == "op":
            op_attrs = what[len(n.op.name) + 1:-1]  # node_text: "op(attrs)" or "op"
            what = f"{n.op.name}({args}{', ' if args and op_attrs else ''}{op_attrs})"
        notes = []
        if classes is not None:
            notes.append(f"{classes[n]:<5}")
        if groups is not None:
            notes.append(f"g{group_of[n.key]:<3}" if n.key in group_of else "    ")
        tail = f"   -> output {', '.join(outputs[n.key])}" if n.key in outputs else ""
        lines.append(f"  %{i:<3} {what:<48} {describe(n.shape):<14} {str(n.dtype):<8}"
                     f"{' '.join(notes)}{tail}".rstrip())
    return "\n".join(lines)
