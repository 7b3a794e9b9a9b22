"""``einsum``: one primitive for NumPy's and PyTorch's subscripts: explicit (``"ij,jk->ik"``)
and implicit output (``"ij,jk"``: the letters used once, in alphabetical order), batch letters,
``...`` (broadcast like NumPy), and repeated letters in one operand (``"ii->i"``, a diagonal;
``"ii"``, a trace).

The wrapper rewrites the subscripts into the primitive's form: explicit, without ``...`` (each
broadcast axis gets a letter of its own, and operands whose broadcast axes have size 1 are
broadcast first, so ``broadcast_to``'s gradient sums them back). The gradient of operand k is
an einsum too, with the subscripts permuted: the output's gradient and the other operands
contracted to operand k's letters, with constant ones for letters only operand k has (they
were summed) and identity matrices putting a repeated letter's gradient on its diagonal.
Inside a vertex cell the batching rule gives the per-row operands and the output one more
letter, the task's rows.
"""

import string

import numpy as np

from . import indexing, registry, shape
from .registry import Aval, Op, apply, common_dtype, describe, register
from ..errors import ArgumentError, ShapeError

LETTERS = string.ascii_uppercase + string.ascii_lowercase  # NumPy's order of labels


def _split(subscripts):
    inputs, output = subscripts.split("->")
    return inputs.split(","), output


def _einsum_forward(xp, *arrays, subscripts):
    if xp is np:
        return np.einsum(subscripts, *arrays, optimize=len(arrays) > 1)  # BLAS for products
    return xp.einsum(subscripts, *arrays)


def _sizes(opname, terms, avals):
    """letter -> size; a letter with two sizes is an error naming both operands."""
    sizes, first = {}, {}
    for k, (term, aval) in enumerate(zip(terms, avals)):
        for letter, size in zip(term, aval.shape):
            if letter in sizes and sizes[letter] != size:
                raise ShapeError(f"op '{opname}': subscript '{letter}' has size "
                                 f"{sizes[letter]} in argument {first[letter]} and {size} in "
                                 f"argument {k} (shapes {describe(avals[first[letter]].shape)} "
                                 f"and {describe(aval.shape)})")
            sizes.setdefault(letter, size)
            first.setdefault(letter, k)
    return sizes


def _infer_einsum(*avals, subscripts):
    terms, output = _split(subscripts)
    dtype = common_dtype("einsum", avals)
    sizes = _sizes("einsum", terms, avals)
    return Aval(tuple(sizes[letter] for letter in output), dtype)


def _constant(like, array):
    array = array.astype(np.dtype(like.dtype))
    tracer = getattr(like, "tracer", None)  # a symbol: a constant of its graph (a ∂ graph)
    return tracer.constant(array) if tracer is not None else indexing._on_device_of(like, array)


def _einsum_vjp(g, out, *operands, subscripts):
    terms, output = _split(subscripts)
    sizes = {}
    for term, x in zip(terms, operands):
        sizes.update(zip(term, x.shape))
    unused = iter(letter for letter in LETTERS if letter not in subscripts)
    grads = []
    for k, (term, x) in enumerate(zip(terms, operands)):
        others = [(t, o) for j, (t, o) in enumerate(zip(terms, operands)) if j != k]
        seen_elsewhere = set(output).union(*[set(t) for t, _ in others])
        pieces = [(output, g)] + others
        target = []
        for letter in term:
            if letter in target:  # a repeated letter: its own, tied by an identity matrix
                fresh = next(unused)
                pieces.append((letter + fresh, _constant(g, np.eye(sizes[letter]))))
                target.append(fresh)
                continue
            if letter not in seen_elsewhere:  # summed only here: every element gets g
                pieces.append((letter, _constant(g, np.ones(sizes[letter]))))
            target.append(letter)
        spec = ",".join(t for t, _ in pieces) + "->" + "".join(target)
        grads.append(apply(EINSUM, *[p for _, p in pieces], subscripts=spec))
    return tuple(grads)


def _batch_einsum(op, items, attrs, out):
    terms, output = _split(attrs["subscripts"])
    rows = next(letter for letter in LETTERS if letter not in attrs["subscripts"])
    terms = [rows + t if d else t for t, (_, d) in zip(terms, items)]
    return apply(op, *[s for s, _ in items], subscripts=",".join(terms) + "->" + rows + output)


EINSUM = register(Op("einsum", _einsum_forward, _infer_einsum, _einsum_vjp,
                     batch=_batch_einsum, promotes="all"))


def _parse(subscripts, operands):
    """The subscripts made explicit, with a letter for every axis ``...`` stands for, and the
    operands broadcast where those axes have size 1 against a larger size."""
    if not isinstance(subscripts, str):
        raise ArgumentError(f"einsum: subscripts must be a string such as 'ij,jk->ik', got "
                            f"{type(subscripts).__name__}")
    text = subscripts.replace(" ", "")
    if text.count("->") > 1:
        raise ArgumentError(f"einsum: {subscripts!r} has more than one '->'")
    explicit = "->" in text
    inputs, output = text.split("->") if explicit else (text, None)
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ArgumentError(f"einsum: {subscripts!r} names {len(terms)} operand(s), "
                            f"{len(operands)} given")
    for term in terms + ([output] if explicit else []):
        bad = set(term.replace("...", "")) - set(LETTERS)
        if bad or term.count("...") > 1:
            raise ArgumentError(f"einsum: {subscripts!r}: a term holds letters and at most one "
                                f"'...', got {term!r}")
    used = set(text) & set(LETTERS)
    spare = [letter for letter in LETTERS if letter not in used]
    ranks = []
    for k, (term, x) in enumerate(zip(terms, operands)):
        named = len(term.replace("...", ""))
        extra = len(x.shape) - named
        if extra < 0 or (extra and "..." not in term):
            raise ShapeError(f"einsum: term {term!r} names {named} axes, but operand {k} has "
                             f"shape {describe(x.shape)}")
        ranks.append(extra)
    broadcast = spare[:max(ranks, default=0)]
    terms = [t.replace("...", "".join(broadcast[len(broadcast) - r:])) for t, r in
             zip(terms, ranks)]
    if explicit:
        output = output.replace("...", "".join(broadcast))
        missing = set(output) - set("".join(terms))
        if missing or len(set(output)) != len(output):
            raise ArgumentError(f"einsum: the output of {subscripts!r} must name letters of "
                                f"the inputs, each once")
    else:
        counts = {letter: "".join(terms).count(letter) for letter in used}
        output = "".join(broadcast) + "".join(
            sorted(letter for letter, n in counts.items() if n == 1))
    # the axes ``...`` stands for broadcast as NumPy's do: size 1 stretches to the others'
    sizes = {}
    for term, x in zip(terms, operands):
        for letter, size in zip(term, x.shape):
            if letter in broadcast and size != 1:
                if sizes.get(letter, size) != size:
                    raise ShapeError(f"einsum: the axes '...' stands for do not broadcast "
                                     f"together: sizes {sizes[letter]} and {size}")
                sizes[letter] = size
    operands = [shape.broadcast_to(x, tuple(sizes.get(letter, d) if letter in broadcast else d
                                            for letter, d in zip(term, x.shape)))
                for term, x in zip(terms, operands)]
    return ",".join(terms) + "->" + output, operands


def einsum(subscripts, *operands):
    """Einstein summation, as ``numpy.einsum`` and ``torch.einsum`` (``einsum("ij,jk->ik", a,
    b)`` is ``a @ b``); operands may also come as one list (``einsum(s, [a, b])``)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    operands = [o if hasattr(o, "shape") else registry._as_array(o) for o in operands]
    spec, operands = _parse(subscripts, operands)
    return apply(EINSUM, *operands, subscripts=spec)
