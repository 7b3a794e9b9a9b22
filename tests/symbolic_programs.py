"""Random expression programs for the symbolic-graph tests.

A program is a list of steps over a growing list of values: the inputs first, then each step's
result. Every step is drawn so that it fits the shapes of the values it reads (broadcasting,
matmul inner dimensions, even splits), so the program runs the same way on eager Tensors and on
traced Symbols; :func:`interpret` runs it on either. Parameters (float64 ``mc.Parameter``) are
created by the test and read by closure, as a user's model would.
"""

import numpy as np
from hypothesis import strategies as st

import minicavs as mc

UNARY = {
    "tanh": mc.tanh,
    "sigmoid": mc.sigmoid,
    "neg": lambda x: -x,
    "relu": mc.relu,
    "square": lambda x: x ** 2,
    "soft": lambda x: x / (1 + x * x),
    "log1p_sq": lambda x: mc.log(1 + x * x),
    "exp_tanh": lambda x: mc.exp(mc.tanh(x)),
    "scale": lambda x: 0.5 * x - 1.0,
}
BINARY = {"add": mc.add, "sub": mc.sub, "mul": mc.mul, "maximum": mc.maximum,
          "smooth_div": lambda a, b: a / (1.5 + b * b)}


def _broadcasts(s1, s2):
    try:
        np.broadcast_shapes(s1, s2)
        return True
    except ValueError:
        return False


@st.composite
def programs(draw, max_steps=8):
    """``(input_shapes, param_shapes, steps, outputs)``; see the module docstring."""
    side = st.integers(1, 4)
    shape = st.lists(side, min_size=1, max_size=3).map(tuple)
    input_shapes = draw(st.lists(shape, min_size=1, max_size=3))
    shapes = list(input_shapes)
    param_shapes = []
    steps = []

    def new_param(s):
        param_shapes.append(tuple(s))
        return ("param", len(param_shapes) - 1)

    for _ in range(draw(st.integers(1, max_steps))):
        i = draw(st.integers(0, len(shapes) - 1))
        s = shapes[i]
        kinds = ["unary", "unary", "binary", "binary", "reshape"]
        if len(s) >= 1:  # a full reduction makes a 0-d value, which these do not take
            kinds += ["sum", "matmul", "concat", "softmax"]
        if len(s) >= 2:
            kinds.append("transpose")
        if any(d % 2 == 0 for d in s):
            kinds.append("split")
        kind = draw(st.sampled_from(kinds))
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), i))
            shapes.append(s)
        elif kind == "binary":
            name = draw(st.sampled_from(sorted(BINARY)))
            partners = [j for j, t in enumerate(shapes) if _broadcasts(s, t)]
            how = draw(st.sampled_from(["value", "param", "scalar"]))
            if how == "value":
                other = ("value", draw(st.sampled_from(partners)))
                out = np.broadcast_shapes(s, shapes[other[1]])
            elif how == "param":  # a trailing part of the shape, some sides 1: it broadcasts
                k = draw(st.integers(0, len(s)))
                ps = tuple(d if draw(st.booleans()) else 1 for d in s[len(s) - k:])
                other = new_param(ps)
                out = s
            else:
                other = ("scalar", draw(st.sampled_from([-1.5, 0.5, 2.0])))
                out = s
            swap = draw(st.booleans())
            steps.append(("binary", name, i, other, swap))
            shapes.append(tuple(out))
        elif kind == "sum":
            reducer = draw(st.sampled_from(["sum", "mean", "max"]))
            axis = draw(st.one_of(st.none(), st.integers(-len(s), len(s) - 1)))
            keepdims = draw(st.booleans())
            steps.append(("reduce", reducer, i, axis, keepdims))
            axes = range(len(s)) if axis is None else [axis % len(s)]
            out = tuple(1 if keepdims and a in axes else d for a, d in enumerate(s)
                        if keepdims or a not in axes)
            if out == ():
                out = ()
            shapes.append(out)
        elif kind == "matmul":
            m = draw(st.integers(1, 4))
            if draw(st.booleans()) or len(s) < 2:
                steps.append(("matmul", i, new_param((s[-1], m)), False))
                shapes.append(s[:-1] + (m,))
            else:  # a matrix from the left: P (m, rows) @ x (..., rows, cols)
                steps.append(("matmul", i, new_param((m, s[-2])), True))
                shapes.append(s[:-2] + (m, s[-1]))
        elif kind == "reshape":
            target = (-1,) if draw(st.booleans()) else tuple(reversed(s))
            steps.append(("reshape", i, target))
            shapes.append((int(np.prod(s)),) if target == (-1,) else target)
        elif kind == "transpose":
            steps.append(("transpose", i))
            shapes.append(tuple(reversed(s)))
        elif kind == "concat":
            same = [j for j, t in enumerate(shapes) if len(t) == len(s)]
            axis = draw(st.integers(0, len(s) - 1))
            fits = [j for j in same if all(a == b for d, (a, b) in enumerate(zip(s, shapes[j]))
                                           if d != axis)]
            j = draw(st.sampled_from(fits))
            steps.append(("concat", i, j, axis))
            out = list(s)
            out[axis] += shapes[j][axis]
            shapes.append(tuple(out))
        elif kind == "softmax":
            steps.append(("softmax", i))
            shapes.append(s)
        elif kind == "split":
            axis = draw(st.sampled_from([a for a, d in enumerate(s) if d % 2 == 0]))
            steps.append(("split", i, axis))
            half = list(s)
            half[axis] //= 2
            shapes.extend([tuple(half), tuple(half)])
    last = len(shapes) - 1
    outputs = [last]
    extra = draw(st.one_of(st.none(), st.integers(len(input_shapes), last)))
    if extra is not None and extra != last:
        outputs.append(extra)
    return input_shapes, param_shapes, steps, outputs


def interpret(program, inputs, params):
    """Run ``program`` on ``inputs`` (Tensors or Symbols); ``params`` are Tensors."""
    _, _, steps, outputs = program
    values = list(inputs)

    def operand(ref):
        kind, what = ref
        if kind == "value":
            return values[what]
        if kind == "param":
            return params[what]
        return what  # a Python scalar

    for step in steps:
        kind = step[0]
        if kind == "unary":
            values.append(UNARY[step[1]](values[step[2]]))
        elif kind == "binary":
            _, name, i, other, swap = step
            a, b = values[i], operand(other)
            values.append(BINARY[name](b, a) if swap else BINARY[name](a, b))
        elif kind == "reduce":
            _, reducer, i, axis, keepdims = step
            values.append(getattr(mc, reducer)(values[i], axis=axis, keepdims=keepdims))
        elif kind == "matmul":
            _, i, p, from_left = step
            values.append(mc.matmul(operand(p), values[i]) if from_left
                          else mc.matmul(values[i], operand(p)))
        elif kind == "reshape":
            values.append(mc.reshape(values[step[1]], step[2]))
        elif kind == "transpose":
            values.append(mc.transpose(values[step[1]]))
        elif kind == "concat":
            values.append(mc.concat([values[step[1]], values[step[2]]], axis=step[3]))
        elif kind == "softmax":
            values.append(mc.softmax(values[step[1]]))
        elif kind == "split":
            values.extend(mc.split(values[step[1]], 2, axis=step[2]))
    return [values[i] for i in outputs]


def arrays_for(data, shapes, bound=2.0):
    """Draw one float64 array per shape, elements in [-bound, bound]."""
    from minicavs.testing import float_arrays

    return [data.draw(float_arrays(s, bound=bound)) for s in shapes]
