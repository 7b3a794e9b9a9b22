"""An elementwise formula written once, used three ways.

A formula is written like an op's forward, ``f(xp, *operands)``, with Python's arithmetic
operators and ``xp.exp``, ``xp.log``, ``xp.tanh``: ``lambda xp, x: 1 / (1 + xp.exp(-x))``.
Run on NumPy or CuPy arrays it is the forward. Traced once on stand-ins, it gives the C
expression of the fusion code generators (:func:`c_expr`) and a NumPy writer ``fn(x, out)``
that runs each step as one ufunc writing into ``out``, with no temporaries (:func:`writer`;
the fastest CPU form, see runtime/executor.py). The three cannot disagree.
"""

import numpy as np

_INFIX = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
_FUNCTIONS = ("exp", "log", "tanh")  # spelt the same in NumPy and C


class _Node:
    """A traced value: operand k (``name`` None) or a ufunc applied to ``args`` (nodes and
    Python numbers)."""

    def __init__(self, name=None, args=(), operand=None):
        self.name, self.args, self.operand = name, args, operand

    def __neg__(self): return _Node("negative", (self,))
    def __add__(self, other): return _Node("add", (self, other))
    def __radd__(self, other): return _Node("add", (other, self))
    def __sub__(self, other): return _Node("subtract", (self, other))
    def __rsub__(self, other): return _Node("subtract", (other, self))
    def __mul__(self, other): return _Node("multiply", (self, other))
    def __rmul__(self, other): return _Node("multiply", (other, self))
    def __truediv__(self, other): return _Node("divide", (self, other))
    def __rtruediv__(self, other): return _Node("divide", (other, self))


class _Functions:
    """The ``xp`` a formula is traced with."""

    def __getattr__(self, name):
        if name not in _FUNCTIONS:
            raise AttributeError(f"formula: xp.{name} is not one of {_FUNCTIONS}")
        return lambda x: _Node(name, (x,))


def _trace(formula, arity):
    return formula(_Functions(), *[_Node(operand=k) for k in range(arity)])


def _c(value):
    if not isinstance(value, _Node):  # a constant: ints stay ints, floats take the kernel's type
        return str(value) if isinstance(value, int) else f"({{T}}){float(value)!r}"
    if value.name is None:
        return "{%d}" % value.operand
    args = [_c(a) for a in value.args]
    if value.name in _INFIX:
        return f"({args[0]} {_INFIX[value.name]} {args[1]})"
    if value.name == "negative":  # "--x" would be C's decrement
        return f"-({args[0]})" if args[0].startswith("-") else f"-{args[0]}"
    return f"{value.name}({args[0]})"


def c_expr(formula, arity=1):
    """The C expression of ``formula`` (``{0}``, ``{1}``, ... are the operands)."""
    return _c(_trace(formula, arity))


def writer(formula, arity=1):
    """A NumPy writer ``fn(*operands, out)`` for ``formula``: each step one ufunc writing into
    ``out``. The formula must be a chain (each step reads the one before it, and every operand
    is read once), so ``out`` may be an operand: the writer works in place."""
    steps = []
    node = _trace(formula, arity)
    while isinstance(node, _Node) and node.name is not None:
        steps.append(node)
        inner = [a for a in node.args if isinstance(a, _Node) and a.name is not None]
        if len(inner) > 1:
            raise ValueError(f"formula {formula!r} is not a chain of steps")
        node = inner[0] if inner else None
    reads = [a.operand for s in steps for a in s.args if isinstance(a, _Node) and a.name is None]
    if sorted(reads) != list(range(arity)):
        raise ValueError(f"formula {formula!r} must read each of its {arity} operand(s) once")

    def text(arg):
        if not isinstance(arg, _Node):
            return f"t({arg!r})"  # a constant in the output's dtype
        return "out" if arg.name is not None else f"x{arg.operand}"

    operands = ", ".join(f"x{k}" for k in range(arity))
    lines = [f"def write({operands}, out):", "    t = out.dtype.type"]
    lines += [f"    {s.name}({', '.join(text(a) for a in s.args)}, out)" for s in reversed(steps)]
    source = "\n".join(lines)
    scope = {s.name: getattr(np, s.name) for s in steps}
    exec(source, scope)  # noqa: S102 (generated from the formula's own steps)
    write = scope["write"]
    write.__doc__ = source
    return write
