"""Recursive definitions (``mc.recursive``): a model written as a function of one node that calls
itself on the node's children, in the spirit of recursive SubGraphs (recursion paper §3).

```python
@mc.recursive(scatter_shape=(H,), pull_shape=(1,), pull_dtype="int64")
def tree_rnn(node):
    if node.is_leaf:                       # a graph fact: decided per vertex, before tracing
        return mc.reshape(mc.embedding(table, node.pull()), (H,))
    h_l, h_r = [tree_rnn(child) for child in node.children]
    return mc.tanh(mc.concat([h_l, h_r]) @ W + b)
out = tree_rnn(batch, pull=word_ids)       # one row per vertex: what each call returned
```

The function is traced once per *kind* of vertex that occurs — its number of children, and its
tag when ``tag=`` is given with the call and the function reads ``node.tag`` — into an ordinary vertex function cell: ``node.pull()``
and ``node.push(x)`` are ``v.pull()`` and ``v.push(x)``, a call on ``node.children[k]`` is
``v.gather(k)``, and the returned value is ``v.scatter``-ed (it is what the parent's call
receives). The kinds then run as one :class:`~minicavs.vertex.kinds.KindedFunction`: each kind's
program on its own rows, so a leaf pays nothing for its absent children. Parameters the function
closes over are captured (the paper's "outer reference"); backprop through the recursion is the
∂F of each kind. Traces are cached, and so is the KindedFunction of each set of kinds.

Only graph facts may steer the Python code (``node.is_leaf``, ``node.arity``, ``node.tag``,
``node.children``); a branch on a computed value raises an error: a structure decided by values
is grown at run time, which a recursive definition is not.
"""

import threading

import numpy as np

from .. import validate
from ..autodiff.symbolic import Symbol
from ..errors import GraphError, MinicavsError, ShapeError, TracedBranchError
from .batching import VertexSymbol
from .graphs import GraphBatch, InputGraph
from .cell import TracedCell
from .kinds import KindedFunction, check_tag, kinds_of_vertices
from ..locations import format_location, user_location


class Child:
    """Child ``k`` of the node being traced; ``f(child)`` is the state ``f`` returned for it."""

    __slots__ = ("node", "k")

    def __init__(self, node, k):
        self.node, self.k = node, k

    def __repr__(self):
        return f"Child({self.k} of the node being traced)"


class Node:
    """The vertex a recursive function defines, as its code sees it (one object per trace)."""

    def __init__(self, function, vertex, arity, tag):
        self._function, self._vertex = function, vertex
        self.arity = arity  # its number of children
        self.is_leaf = arity == 0
        self.children = [Child(self, k) for k in range(arity)]
        self._tag = tag
        self._states = {}

    @property
    def tag(self):
        self._function._tag_read = True  # this kind's trace depends on the tag
        if self._tag is None:
            raise GraphError(f"recursive function {self._function.name!r}: node.tag read, but "
                             f"the call gave no tag= (one integer per vertex)"
                             + format_location(user_location()))
        return self._tag

    def pull(self):
        """This vertex's row of the tensor given as ``pull=``."""
        return self._vertex.pull()

    def push(self, x):
        """This vertex's output to the outside: its row of what the call returns."""
        self._vertex.push(x)

    def state_of(self, child):
        if child.k not in self._states:
            self._states[child.k] = self._vertex.gather(child.k)
        return self._states[child.k]

    def __repr__(self):
        return f"Node(arity={self.arity}{'' if self._tag is None else f', tag={self._tag}'})"


def _kind_name(key):
    arity, tag = key
    name = "leaf" if arity == 0 else f"arity {arity}"
    return name if tag is None else f"{name}, tag {tag}"


class RecursiveFunction:
    """A function of one node, run over batches of graphs (see the module docstring).

    The keywords are those of :class:`~minicavs.vertex.function.VertexFunction`:
    ``scatter_shape`` is the shape of what the function returns per vertex; ``arity`` (optional)
    bounds the number of children. ``f(batch, pull=X, tag=T)`` (``batch``: a GraphBatch or one
    InputGraph) returns one row per vertex: the pushed outputs, else the returned states;
    ``rows=R`` (vertex ids, e.g. ``batch.roots``) those vertices' rows only, as a vertex
    function's ``rows=``: the gradient of the others is known to be zero, and ∂F skips their
    work (a kind none of whose vertices is asked for skips its pushed output's).
    """

    def __init__(self, fn, scatter_shape, pull_shape=None, push_shape=None, arity=None,
                 dtype=None, pull_dtype=None, name=None, options=None):
        if not callable(fn):
            raise GraphError(f"mc.recursive: decorates a function of one node, got "
                             f"{type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "recursive")
        self.scatter_shape = validate.shape(scatter_shape, "scatter_shape", "mc.recursive",
                                            error=ShapeError)
        if arity is not None:
            validate.integer(arity, "arity (the most children a vertex may have)",
                             "mc.recursive", minimum=0, error=GraphError)
        self.arity = arity
        self.keywords = dict(scatter_shape=scatter_shape, pull_shape=pull_shape,
                             push_shape=push_shape, dtype=dtype, pull_dtype=pull_dtype,
                             options=options)
        self.kinds = {}  # (arity, tag) -> the cell traced for that kind (a TracedCell)
        self._ids = {}  # (arity, tag) -> the integer that names the kind in a call
        self._functions = {}  # frozenset of kind ids -> KindedFunction
        self._local = threading.local()  # this thread's trace: _tracing, _tag_read
        self._kinds_lock = threading.RLock()  # kinds traced and numbered by one thread at a time
        self._last = None

    # The Node being traced in this thread (None: no trace runs here), and whether its trace
    # read node.tag. Per thread: a call in one thread while another traces is a call, not a
    # call on a child inside that trace.
    _tracing = property(lambda self: getattr(self._local, "node", None),
                        lambda self, node: setattr(self._local, "node", node))
    _tag_read = property(lambda self: getattr(self._local, "tag_read", False),
                         lambda self, read: setattr(self._local, "tag_read", read))

    def __call__(self, batch, pull=None, tag=None, rows=None):
        if self._tracing is not None:
            return self._recurse(batch, pull, tag, rows)
        if isinstance(batch, InputGraph):
            batch = GraphBatch([batch])
        if not isinstance(batch, GraphBatch):
            raise GraphError(f"recursive function {self.name!r} is called on a GraphBatch or "
                             f"an InputGraph (or, inside its definition, on one of "
                             f"node.children), got {type(batch).__name__}")
        if self.arity is not None:
            batch.check_arity(self.arity, f"recursive function {self.name!r}")
        tags = None if tag is None else check_tag(tag, batch, f"recursive function "
                                                               f"{self.name!r}")
        # The kind of each vertex, vectorised: its (arity, tag) pair, numbered by first trace.
        if tags is None:
            distinct, inverse = kinds_of_vertices(batch, "arity")  # (memoised on the batch)
            keys = [(a, None) for a in distinct]
        else:
            pairs, inverse = np.unique(np.stack([batch.num_children, tags], axis=1), axis=0,
                                       return_inverse=True)
            keys = [(int(a), int(t)) for a, t in pairs]
        with self._kinds_lock:  # (two threads meeting a new kind: it gets one trace, one id)
            keys = [self._traced_kind(key) for key in keys]
            ids = np.array([self._ids[key] for key in keys], dtype=np.int64)
            present = frozenset(ids.tolist())
            f = self._functions.get(present)
            if f is None:
                f = self._functions[present] = self._kinded(list(dict.fromkeys(keys)))
        kind_ids = ids[inverse.reshape(-1)]
        self._last = f
        return f(batch, pull=pull, tag=kind_ids, rows=rows)

    def _kinded(self, keys):
        cells = {self._ids[k]: self.kinds[k].cell for k in keys}
        traced = {self._ids[k]: self.kinds[k] for k in keys}
        f = KindedFunction(cells, "tag", name=self.name, _traced=traced, **self.keywords)
        f.chosen_by = "by each vertex's number of children (and tag, where given)"
        f.kind_names = {self._ids[k]: _kind_name(k) for k in keys}
        return f

    def _traced_kind(self, key):
        """The kind that runs vertices of ``key`` = (arity, tag), traced if new. A trace that
        never read ``node.tag`` serves every tag of its arity: it is kept as (arity, None)."""
        arity, tag = key
        if (arity, None) in self.kinds:
            return arity, None
        if key not in self.kinds:
            self._tag_read = False
            self._trace(key)
            if tag is not None and not self._tag_read:
                self.kinds[arity, None] = self.kinds.pop(key)
                self._ids[arity, None] = self._ids.pop(key)
                return arity, None
        return key

    def _trace(self, key):
        arity, tag = key

        def cell(v):
            node = Node(self, v, arity, tag)
            outer, self._tracing = self._tracing, node
            try:
                state = self.fn(node)
            except TracedBranchError as exc:
                at = str(exc).partition("\n  at ")[2]
                raise TracedBranchError(
                    f"recursive function {self.name!r} (tracing a vertex of kind "
                    f"{_kind_name(key)!r}): a branch on a computed value. A recursive definition "
                    f"may branch on graph facts only (node.is_leaf, node.arity, node.tag, "
                    f"node.children); a structure decided by computed values must be grown at "
                    f"run time, which mc.recursive does not do. For a choice per element, use "
                    f"mc.where." + (f"\n  at {at}" if at else "")) from None
            except MinicavsError as exc:  # e.g. a binary cell meeting a vertex of 3 children
                what = f"{arity} children" + ("" if tag is None else f", tag {tag}")
                raise type(exc)(f"recursive function {self.name!r}, tracing a vertex of kind "
                                f"{_kind_name(key)!r} ({what}; traced when a batch first has "
                                f"one): {exc}") from None
            finally:
                self._tracing = outer
            self._check_return(state, key)
            v.scatter(state)

        self.kinds[key] = TracedCell(cell, arity=arity, name=f"{self.name}[{_kind_name(key)}]",
                                     **self.keywords)
        self._ids[key] = len(self._ids)

    def _check_return(self, state, key):
        code = getattr(self.fn, "__code__", None)
        where = f"\n  defined at {code.co_filename}:{code.co_firstlineno}" if code else ""
        if state is None:
            raise GraphError(f"recursive function {self.name!r} returned nothing for a vertex "
                             f"of kind {_kind_name(key)!r}: it must return the state its "
                             f"parent's call receives, of shape {self.scatter_shape}{where}")
        if not isinstance(state, (VertexSymbol, Symbol)):
            raise GraphError(f"recursive function {self.name!r} returned "
                             f"{type(state).__name__} for a vertex of kind {_kind_name(key)!r}: "
                             f"it must return a value computed with mc.* operations (from the "
                             f"node's pull, its children's states, parameters){where}")
        if tuple(state.shape) != self.scatter_shape:
            raise ShapeError(f"recursive function {self.name!r} returns per-vertex shape "
                             f"{tuple(state.shape)} for a vertex of kind {_kind_name(key)!r}, "
                             f"but declares scatter_shape={self.scatter_shape}{where}")

    def _recurse(self, target, pull, tag, rows):
        node = self._tracing
        where = format_location(user_location())
        if pull is not None or tag is not None or rows is not None:
            raise GraphError(f"recursive function {self.name!r}: a call on a child takes no "
                             f"pull=, tag= or rows= (the child pulls its own row)" + where)
        if isinstance(target, Child) and target.node is node:
            return node.state_of(target)
        if isinstance(target, Child):
            problem = "a child of another node (a node's children are only its own)"
        elif target is node:
            problem = "the node itself (the recursion would never reach a leaf)"
        elif isinstance(target, Node):
            problem = "another node"
        else:
            problem = f"a {type(target).__name__}"
        raise GraphError(f"recursive function {self.name!r}: a recursive call takes one of "
                         f"node.children, got {problem}" + where)

    @property
    def params(self):
        """The parameters the function closes over, in every kind traced so far."""
        return list({id(p): p for f in self.kinds.values() for p in f.params}.values())

    @property
    def program(self):
        """The Programs of F of every kind traced so far (``.dump()`` prints them; the
        ``backward_program`` property gives ∂F's)."""
        if not self.kinds:
            raise GraphError(f"recursive function {self.name!r} has not run yet (it is traced "
                             f"per kind of vertex on its first call)")
        return self._kinded(list(self.kinds)).program

    @property
    def backward_program(self):
        return self.program.function.backward_program

    def dump(self):
        """``program.dump()``: the Programs of F of every kind traced so far."""
        return self.program.dump()

    def explain(self, out=None):
        """Figures of the latest call (or of the call that returned ``out``), per kind."""
        if self._last is None:
            raise GraphError("explain(): the recursive function has not run yet")
        return self._last.explain(out)

    def __repr__(self):
        kinds = ", ".join(_kind_name(k) for k in self.kinds) or "none yet"
        return f"RecursiveFunction({self.name!r}: kinds traced: {kinds})"


def recursive(fn=None, **keywords):
    """Decorator: ``@mc.recursive(scatter_shape=..., ...)`` over ``def f(node): ...`` (see the
    module docstring); the keywords are those of VertexFunction."""
    if "scatter_shape" not in keywords:
        raise GraphError("mc.recursive: scatter_shape= is required (the shape of what the "
                         "function returns per vertex)")
    if fn is not None:
        return RecursiveFunction(fn, **keywords)
    return lambda f: RecursiveFunction(f, **keywords)
