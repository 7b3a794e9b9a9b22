"""(CuPy) An autobatched segment's batches issued from C, forward and backward (issue 42).

On a GPU a batch of an LSTM step is three or four launches — a gather of its operands where
their rows are not one run, two products, the cell — each issued from Python through the
interpreter and CuPy, tens of microseconds of host time apiece against a few of device work.
Here a signature's batched kernel, and the ∂ of its per-row operands, are translated once
into the C issuer's operations (``cuda/issuer.py``: a kernel launch or a cuBLAS product,
their arguments integers) with a *hole* wherever a batch's address goes::

    gather      f(slab, rows, gathered block, n)     where an operand's rows are not one run
    product     gemm(n x K · K x N)                  a batch's rows times a shared matrix
    fused group f(operands..., n)                    cuda/windows.level_source over rows
    LSTM cell   lstm_cell_sum(terms, c, pre, out)    cuda/kernels.py (and its gradient)
    concat      f(parts..., out, n)                  the parts' columns side by side
    add into    f(gradient, slab rows, n)            atomic where the rows are indexed
    Xᵀ·G, Σ G   gemm over the rows (GEMM_INNER)       the '+' strategies' shared gradients

A hole is ``(base, byte offset)``; a batch's bases are its operands' first rows in their slabs
(some of their columns where read through a view) or in a gathered block, its rows of the
segment's scratch blocks (one per value a kernel makes, all batches of a signature one after
another, in plan order: ``b.sig_row``), its output rows or its gradient's, and the shared
arrays. :class:`Issuer` fills them batch by batch and issues every batch of a run in one C
call; a batch the template does not cover (an operand from several slabs or reshaped, an op
with no launch here, a gradient of a shared operand outside the ``+`` strategies:
``explain()`` names them) runs on the interpreter in its turn, the queue issued first. The
backward reads a batch's values where the forward left them (:class:`_Values`: arrays made
only when the interpreter needs them); the ``+`` strategies' one product per signature reads
its batches' rows of a block as one view (:meth:`Issuer.joined`) and is issued from C too
(:meth:`Issuer.queue_shared`: a weight's gradient one gemm over the rows, a bias's the rows
summed as ones·G).
"""

import ctypes
import functools
from collections import namedtuple

import numpy as np

from ..csource import compute_dtype, elementwise_source
from ..errors import KernelCompileError
from ..cuda import blas, issuer, products
from ..cuda import kernels as cuda_kernels
from ..ops.batching import row_domain
from ..runtime.analysis import FusedGroup
from ..runtime.executor import GroupStep, SummedCellStep
from ..runtime.program import Compute


class Unsupported(Exception):
    """Why a signature's batches stay on the interpreter."""


# Where a value's rows are: ``bases[base] + offset`` is its first row, rows ``ld`` elements
# apart, ``width`` columns (``ld`` None: a shared array, read whole); ``ndim`` its rank.
Ref = namedtuple("Ref", "base offset ld width dtype ndim")


class Template:
    """A signature's forward as the issuer's code with holes: ``code[at] = address of
    bases[base] + offset`` for each hole. ``bases``: ``("in", k)`` operand k's rows,
    ``("src", k)`` / ``("idx", k)`` its slab and row indices where it is gathered, ``("block",
    key)`` the batch's rows of a block (``blocks[key]``: its row width and dtype; a value the
    kernel makes, or ``("gathered", k)``), ``("out",)`` the output rows, ``("fixed", key)`` a
    shared array. ``values``: the kernel's values as :class:`Ref`."""

    def __init__(self, code, holes, bases, blocks, values, names):
        code = np.array(code, np.int64)
        self.at = np.flatnonzero(code < _HOLE)
        number = _HOLE - 1 - code[self.at]  # (the hole each stand-in is)
        self.base = np.array([holes[j][0] for j in number.tolist()], np.int64)
        self.offset = np.array([holes[j][1] for j in number.tolist()], np.int64)
        code[self.at] = 0
        self.code = code
        self.bases, self.blocks, self.values, self.names = bases, blocks, values, names


def issuer_for(segment):
    """The segment's :class:`Issuer`, or None (NumPy; ``MINICAVS_CUDA_ISSUER=python``; no
    issuer here: ``stats["why_not_from_c"]`` says why)."""
    if segment.xp is np or not issuer.enabled():
        return None
    driver = issuer.driver(segment.xp)
    if isinstance(driver, str):
        segment.stats["why_not_from_c"] = {"every signature": driver}
        return None
    made = Issuer(segment, driver)
    made.plan(segment.plan)
    return made


class Issuer:
    """One segment's batches from C (see the module docstring): :meth:`queue` a batch's
    forward, :meth:`queue_backward` its ∂ (where it does not go, the batch runs on the
    interpreter, :meth:`flush` first), :meth:`flush` issues the queue. ``why``: per signature
    label, why its batches stay on the interpreter; ``forward``, ``backward``: how many went."""

    def __init__(self, segment, driver):
        self.segment, self.driver, self.xp = segment, driver, segment.xp
        self.address = cuda_kernels.device_address(self.xp)
        self.pointers = np.zeros(1, np.int64)  # (slot 0 holds 0: every hole is an address)
        self.context = driver.context(self.pointers)
        self.fixed, self.made, self.rows, self.blocks = {}, {}, {}, {}  # (a segment's)
        self.queued, self.why, self.forward, self.backward, self.shared = [], {}, 0, 0, 0
        self.ones_by_dtype = {}

    def plan(self, plan):
        """Each signature's rows in the segment, before its blocks are made, and each batch's
        first row among them (``b.sig_row``: its rows of a block, forward and backward)."""
        rows = self.rows
        for b in plan:
            b.sig_row = rows.get(b.sig, 0)
            rows[b.sig] = b.sig_row + b.n

    def queue(self, b):
        """Queue batch ``b``: its :class:`Template`, or None where it runs on the
        interpreter."""
        inputs = b.inputs
        forms, slabs = [], self.segment.slabs
        for _, slab, _, rows, _, view in inputs:
            if slab is None or (view is not None and not view.is_columns):
                self.why.setdefault(b.sig.label, "an operand from several slabs or reshaped")
                return None
            forms.append((rows is not None, view and (view.start, view.stop),
                          slabs[slab].shape[-1] if slabs[slab].ndim > 1 else 1))
        forms = tuple(forms)
        made = self.made.get((b.sig, forms))
        if made is None:  # (found once a segment per signature and form)
            kernel = b.sig.forward
            fixed = kernel.exe.constants(self.xp)
            fixed.update((key, t._array) for key, t in b.shared)
            self.fixed[b.sig] = fixed
            made = self.made[(b.sig, forms)] = template(kernel, forms, fixed, _layouts(fixed),
                                                        self.driver)
        if isinstance(made, str):
            self.why.setdefault(b.sig.label, made)
            return None
        n, address, bases = b.n, self.address, []
        for thing in made.bases:
            kind = thing[0]
            if kind in ("in", "block", "out"):  # (the batch's first row of a slab or block)
                if kind == "block":
                    self.block(b.sig, thing[1], made.blocks[thing[1]])
                array, first = self._rows_of(b, thing)
                bases.append(address(array) + first * array.strides[0])
            elif kind == "fixed":
                bases.append(address(self.fixed[b.sig][thing[1]]))
            else:  # src, idx: the gathered operand's slab and rows
                _, slab, _, rows, _, _ = inputs[thing[1]]
                bases.append(address(slabs[slab] if kind == "src" else rows))
        code = made.code.copy()
        code[made.at] = np.array(bases, np.int64)[made.base] + made.offset
        self.queued.append((code, n, b.sig.label, made, None))
        self.forward += 1
        if b.sig.can_grad:
            b.env = _Values(self, b, made, self.fixed[b.sig])
        return made

    def queue_backward(self, b, kernel, cotangent, gslabs):
        """Queue batch ``b``'s ∂ of its per-row operands (``kernel``; each gradient added into
        its rows of ``gslabs``): True, or False where it runs on the interpreter."""
        forms, targets = [], []
        if len(kernel.cotangents) != 1:  # (a rows' ∂ starts from the batch's own cotangent)
            return False
        for symbol in kernel.wrt:
            target = b.targets[symbol]
            if not isinstance(target, tuple) or target[1] is None or (
                    target[5] is not None and not target[5].is_columns):
                self.why.setdefault(f"{b.sig.label} (backward)",
                                    "a gradient of a shared operand, or into several slabs")
                return False
            _, slab, lo, rows, _, view = target
            gslab = gslabs[slab]
            forms.append((rows is not None, view and (view.start, view.stop),
                          gslab.shape[-1] if gslab.ndim > 1 else 1))
            targets.append(target)
        address, env = self.address, b.env
        fixed = self.fixed.get((b.sig, kernel))
        if fixed is None:  # (the shared values it reads: the same for every batch of sig)
            fixed = kernel.exe.constants(self.xp)
            fixed.update((s.key, env[f.key]) for (f, s), is_row in zip(
                kernel.refs, kernel.ref_is_row) if not is_row)
            self.fixed[(b.sig, kernel)] = fixed
        row_keys = [f.key for (f, _), is_row in zip(kernel.refs, kernel.ref_is_row) if is_row]
        located = [(address(cotangent), _layout(cotangent))]
        for key in row_keys:
            if isinstance(env, _Values):  # (where the forward from C left it: no array made)
                located.append(env.locate(key))
            else:
                located.append((address(env[key]), _layout(env[key])))
        layouts, forms = tuple(layout for _, layout in located), tuple(forms)
        made = self.made.get((b.sig, kernel, layouts, forms))
        if made is None:
            made = "an operand is not rows of floats, each row contiguous" if None in layouts \
                else backward_template(kernel, layouts, forms, fixed, _layouts(fixed),
                                       self.driver)
            self.made[(b.sig, kernel, layouts, forms)] = made
        if isinstance(made, str):
            self.why.setdefault(f"{b.sig.label} (backward)", made)
            return False
        n, bases = b.n, []
        for thing in made.bases:
            kind = thing[0]
            if kind == "arg":
                bases.append(located[thing[1]][0])
            elif kind == "block":
                block = self.block(b.sig, thing[1], made.blocks[thing[1]])
                bases.append(address(block) + b.sig_row * block.strides[0])
            elif kind == "fixed":
                bases.append(address(fixed[thing[1]]))
            else:  # target, tidx: an operand's rows of its gradient slab, its row indices
                _, slab, lo, rows, _, _ = targets[thing[1]]
                gslab = gslabs[slab]
                bases.append(address(rows) if kind == "tidx" else address(gslab) + (
                    0 if rows is not None else lo * gslab.strides[0]))
        code = made.code.copy()
        code[made.at] = np.array(bases, np.int64)[made.base] + made.offset
        self.queued.append((code, n, b.sig.label, made, None))
        self.backward += 1
        stats = self.segment.stats
        for _, _, _, rows, _, _ in targets:
            stats["scatter_made" if rows is not None else "scatter_avoided"] += 1
        if kernel.hands_on:  # (the shared operands' ∂ reads them once every batch is done)
            b.handed = _Handed(self, b, made, [made.values[o.key] for o in
                                               kernel.outputs[len(targets):]],
                               lambda j: cotangent if j == 0 else env[row_keys[j - 1]])
        return True

    def queue_shared(self, sig, kernel, cotangents, env, total):
        """Queue the shared operands' ∂ of ``sig`` over all its batches' rows (``total``;
        ``cotangents`` and the row values of ``env`` joined): the gradients, arrays filled
        once the queue is issued, or None where it runs on the interpreter."""
        fixed = kernel.exe.constants(self.xp)
        args = list(cotangents)
        for (f, s), is_row in zip(kernel.refs, kernel.ref_is_row):
            if is_row:
                args.append(env[f.key])
            else:
                fixed[s.key] = env[f.key]
        layouts = tuple(_layout(a) for a in args)
        made = "an operand is not rows of floats, each row contiguous" if None in layouts \
            else shared_template(kernel, layouts, fixed, _layouts(fixed), self.driver)
        if isinstance(made, str):
            self.why.setdefault(f"{sig.label} (shared operands' gradients)", made)
            return None
        results = {key: self.xp.empty(shape, dtype) for key, (shape, dtype)
                   in made.results.items()}
        address, bases = self.address, []
        for thing in made.bases:
            kind = thing[0]
            if kind == "arg":
                bases.append(address(args[thing[1]]))
            elif kind == "fixed":
                bases.append(address(fixed[thing[1]]))
            elif kind == "result":
                bases.append(address(results[thing[1]]))
            elif kind == "block":  # (a value of the rows made on the way: this call's)
                width, dtype = made.blocks[thing[1]]
                results[thing] = self.xp.empty((total, width), dtype)  # (kept: see below)
                bases.append(address(results[thing]))
            else:  # ones: a row of them, as long as the rows
                bases.append(address(self.ones(np.dtype(thing[1]), total)))
        code = made.code.copy()
        code[made.at] = np.array(bases, np.int64)[made.base] + made.offset
        self.queued.append((code, total, f"{sig.label} (shared operands' gradients)", made,
                            results))  # (its arrays live until it is issued)
        self.shared += 1
        return [results[key].reshape(shape) for key, shape in made.outputs]

    def ones(self, dtype, n):
        """A row of ones as long as any signature's rows in the segment (made once: an
        address in the queue stays valid)."""
        found = self.ones_by_dtype.get(dtype)
        if found is None:
            most = max(self.rows.values(), default=0)
            found = self.ones_by_dtype[dtype] = self.xp.ones(max(n, most), dtype)
        return found

    def joined(self, terms, where):
        """A value of every batch of ``terms`` (of one signature, in forward order) as one
        array, a view: where each lies in its batch's rows of one slab or block and those
        rows follow each other; else None. ``where(b)``: the batch's (ref, template) of the
        value, or None."""
        at = where(terms[0])
        if at is None:
            return None
        ref, made = at
        thing = made.bases[ref.base]
        rows, start = self._rows_of(terms[0], thing)
        if rows is None:
            return None
        end = start + terms[0].n
        for b in terms[1:]:
            at = where(b)
            if at is None or at[0] != ref or at[1].bases[ref.base] != thing:
                return None
            other, first = self._rows_of(b, thing)
            if other is not rows or first != end:
                return None
            end += b.n
        return _view(rows[start:end], ref, end - start)

    def _rows_of(self, b, thing):
        """(the array, b's first row in it) of a base of b's template; (None, 0) for another."""
        if thing[0] == "in":
            _, slab, lo, _, _, _ = b.inputs[thing[1]]
            return self.segment.slabs[slab], lo
        if thing[0] == "out":
            return self.segment.slabs[b.out_slab], b.out_row
        if thing[0] == "block":
            return self.blocks[(b.sig, thing[1])], b.sig_row
        return None, 0

    def block(self, sig, key, layout):
        block = self.blocks.get((sig, key))
        if block is None:
            width, dtype = layout
            block = self.blocks[(sig, key)] = self.xp.empty((self.rows[sig], width), dtype)
        return block

    def flush(self):
        """Issue the queued batches, in order, in one C call."""
        if not self.queued:
            return
        queued, self.queued = self.queued, []
        rows = np.array([(entry[0].ctypes.data, 0, entry[1]) for entry in queued], np.int64)
        failed = ctypes.c_int64(0)
        status = self.driver.issue_many(rows.ctypes.data, len(queued), self.context.address,
                                        ctypes.addressof(failed))
        if status:
            _, n, label, made, _ = queued[failed.value]
            self.driver.raise_on(status, issuer.Table(made.code, lambda op: (
                f"{label}: {made.names[op]}")), 0, n, what="autobatched batch")


class _Values(dict):
    """A C-issued batch's values by symbol key, as the backward pass reads them: each made
    into an array (its rows of a slab or block, a window of their columns) when first read."""

    def __init__(self, issuer_, b, made, fixed):
        super().__init__()
        self.issuer, self.b, self.made, self.fixed = issuer_, b, made, fixed

    def locate(self, key):
        """(address, layout) of the value ``key`` (rows), without making it an array."""
        if key in self:
            value = self[key]
            return self.issuer.address(value), _layout(value)
        ref = self.made.values[key]
        rows, first = self.issuer._rows_of(self.b, self.made.bases[ref.base])
        at = self.issuer.address(rows) + first * rows.strides[0] + ref.offset
        return at, (ref.ld, ref.width, ref.dtype, ref.ndim)

    def __missing__(self, key):
        ref = self.made.values.get(key)
        if ref is None or ref.ld is None:
            value = self.fixed[key]
        else:
            n = self.b.n
            rows, first = self.issuer._rows_of(self.b, self.made.bases[ref.base])
            value = _view(rows[first:first + n], ref, n)
        self[key] = value
        return value


class _Handed:
    """A C-issued batch's cotangents handed on to its signature's shared ∂ (``Template``
    values ``refs``): arrays when read — the batch's rows of a block, or a window of one of
    the ∂'s inputs (``arg(j)``: input j's array)."""

    def __init__(self, issuer_, b, made, refs, arg):
        self.issuer, self.b, self.made, self.refs, self.arg = issuer_, b, made, refs, arg

    def __getitem__(self, j):
        ref, b = self.refs[j], self.b
        thing = self.made.bases[ref.base]
        if thing[0] == "arg":
            return _view(self.arg(thing[1]), ref, b.n)
        rows, first = self.issuer._rows_of(b, thing)
        return _view(rows[first:first + b.n], ref, b.n)

    def where(self, j):
        return self.refs[j], self.made


def _view(rows, ref, n):
    """``ref``'s value in ``rows`` (n rows of its base: a slab's, a block's, an array)."""
    if ref.ndim == 1:
        return rows.reshape(n)
    column = ref.offset // ref.dtype.itemsize
    value = rows.reshape(n, -1)
    return value[:, column:column + ref.width] if column or ref.width != value.shape[1] \
        else value


def _layout(a):
    """(ld, width, dtype, ndim) of an array of rows (1-D: a number a row), or None."""
    if a.dtype.kind != "f" or a.ndim not in (1, 2) or a.strides[-1] != a.itemsize:
        return None
    if a.ndim == 1:
        return 1, 1, a.dtype, 1
    if a.strides[0] % a.itemsize:
        return None
    return a.strides[0] // a.itemsize, a.shape[1], a.dtype, 2


def _layouts(fixed):
    """What a template assumes of its shared arrays."""
    return tuple((k, a.shape, a.strides, a.dtype.str) for k, a in fixed.items())


def template(kernel, forms, fixed, fixed_key, driver):
    """The :class:`Template` of ``kernel`` (a ``signature.BatchedKernel``) for batches whose
    operands have the ``forms`` (per per-row operand: whether it is gathered, the columns of
    a view it is read through or None, its slab's row width), with the shared arrays ``fixed``
    (symbol key -> array: the parameters and constants; ``fixed_key``: their layouts), or the
    reason why not (a string). Kept on the kernel per layout."""
    key = (forms, fixed_key)
    found = kernel.templates.get(key)
    if found is None:
        try:
            made = _Translation(kernel.exe.program, fixed, driver, kernel.output.key)
            made.forward_operands(kernel, forms)
            made.steps()
            found = made.template()
        except Unsupported as why:
            found = str(why)
        kernel.templates[key] = found
    return found


def backward_template(kernel, layouts, targets, fixed, fixed_key, driver):
    """The :class:`Template` of ``kernel`` (a ``signature.BackwardKernel`` whose gradients are
    all of per-row operands) for batches whose per-row inputs (its cotangent, then the forward
    values it reads) have the ``layouts`` and whose gradients go into rows of the ``targets``
    (see :meth:`_Translation.add_into`), or the reason why not. Its handed-on cotangents are
    values of the template."""
    key = (layouts, targets, fixed_key)
    found = kernel.templates.get(key)
    if found is None:
        try:
            made = _Translation(kernel.exe.program, fixed, driver)
            made.backward_operands(kernel.cotangents + [s for _, s in kernel.refs
                                                        if s.key not in fixed], layouts)
            made.steps()
            for j, (output, target) in enumerate(zip(kernel.outputs, targets)):
                made.add_into(j, made.value(output), target)
            for output in kernel.outputs[len(targets):]:  # (handed on: read later as rows)
                if made.value(output).ld is None:
                    raise Unsupported(f"{output.label()} is handed on, and it is not rows")
            found = made.template()
        except Unsupported as why:
            found = str(why)
        kernel.templates[key] = found
    return found


def shared_template(kernel, layouts, fixed, fixed_key, driver):
    """The :class:`Template` of ``kernel`` (a ``signature.BackwardKernel`` of the shared
    operands, run once over every batch of a signature under the '+' strategies: Xᵀ·G
    products, the rows' sums) for inputs of the ``layouts``, or the reason why not. Its
    results (``made.results``) are the gradients, whole arrays."""
    key = ("shared", layouts, fixed_key)
    found = kernel.templates.get(key)
    if found is None:
        try:
            made = _Translation(kernel.exe.program, fixed, driver)
            made.results = {}
            made.backward_operands(kernel.cotangents + [s for _, s in kernel.refs
                                                        if s.key not in fixed], layouts)
            made.steps()
            for output in kernel.outputs:
                if output.key not in made.results_of:
                    raise Unsupported(f"{output.label()} is not made by a product here")
            found = made.template()
            found.results = made.results
            found.outputs = [(made.results_of[o.key], tuple(o.shape)) for o in kernel.outputs]
        except Unsupported as why:
            found = str(why)
        kernel.templates[key] = found
    return found


class _Translation:
    """A batched kernel's Program (forward, or the ∂ of its per-row operands) as a
    :class:`Template`: its operands first (:meth:`forward_operands`, :meth:`backward_operands`),
    then its steps, then where its results go."""

    def __init__(self, program, fixed, driver, output=None):
        self.program, self.fixed, self.driver, self.output = program, fixed, driver, output
        self.arrays = dict(fixed)  # (the shared arrays, and transposes of them)
        self.code, self.holes, self.names, self.blocks = [], [], [], {}
        self.bases, self.refs = [], {}
        # (the shared operands' ∂: its results, whole arrays by key -> (shape, dtype); which
        # values are one of them; its operands read transposed, rows as columns)
        self.results, self.results_of, self.transposed = None, {}, {}

    def forward_operands(self, kernel, forms):
        k = 0
        for symbol, aval in zip(kernel.inputs, kernel.row_avals):
            if aval is None:
                continue
            gathered, columns, slab_width = forms[k]
            if len(aval.shape) > 1 or np.dtype(aval.dtype) not in cuda_kernels.DTYPES:
                raise Unsupported(f"operand {k} is not a row of float32 or float64 numbers")
            width, dtype = int(aval.shape[0]) if aval.shape else 1, np.dtype(aval.dtype)
            start = columns[0] if columns else 0
            if gathered:
                self.blocks[("gathered", k)] = (width, dtype)
                ref = Ref(self.base(("block", ("gathered", k))), 0, width, width, dtype,
                          len(aval.shape) + 1)
                self.gather(k, ref, start, slab_width)
            else:  # (its rows in the slab, some of their columns where read through a view)
                ref = Ref(self.base(("in", k)), start * dtype.itemsize, slab_width, width,
                          dtype, len(aval.shape) + 1)
            self.refs[symbol.key] = ref
            k += 1

    def backward_operands(self, symbols, layouts):
        """The ∂'s per-row inputs (the cotangent, the forward values it reads) as arrays of
        the ``layouts`` ((ld, width, dtype, ndim) each), given per batch."""
        for j, (symbol, layout) in enumerate(zip(symbols, layouts)):
            if layout[2] not in cuda_kernels.DTYPES:
                raise Unsupported(f"{symbol.label()} is {layout[2]}, not float32 or float64")
            self.refs[symbol.key] = Ref(self.base(("arg", j)), 0, *layout)

    def base(self, thing):
        if thing not in self.bases:
            self.bases.append(thing)
        return self.bases.index(thing)

    def steps(self):
        for ins in self.program.eager:
            if not isinstance(ins, Compute) or ins.symbolic:
                raise Unsupported(f"{_name(ins)} is not an op over the batch's rows")
            step = ins.step
            node = getattr(step, "node", None)
            if isinstance(step, SummedCellStep):
                self.cell(step.outputs[1], step.terms, step.outputs[0])
            elif isinstance(step, GroupStep):
                self.elementwise(step.group)
            elif node is None:
                raise Unsupported(f"{_name(ins)} has no launch here")
            elif node.op.native == "window":
                self.window(node)
            elif node.op.native == "product" and node.inputs[0].key in self.transposed:
                self.product_over_rows(node)
            elif node.op.native == "product":
                self.product(node)
            elif node.op.name == "sum" and self.results is not None:
                self.sum_over_rows(node)
            elif node.op.name == "reshape" and node.inputs[0].key in self.results_of:
                self.refs[node.key] = self.refs[node.inputs[0].key]
                self.results_of[node.key] = self.results_of[node.inputs[0].key]
            elif node.op.name == "transpose" and self.results is not None and \
                    self.value(node.inputs[0]).ld is not None:
                self.transposed[node.key] = self.value(node.inputs[0])
            elif node.op.name == "transpose" and node.inputs[0].key in self.arrays:
                self.arrays[node.key] = array = self.arrays[node.inputs[0].key].T
                self.refs[node.key] = self.value(node.inputs[0])._replace(
                    width=array.shape[-1])  # (the same memory, read transposed)
            elif node.op.name == "concat":
                self.concat(node)
            elif node.op.name == "lstm_cell":
                self.cell(node, [node.inputs[0]])
            elif node.op.name == "lstm_cell_grad":
                self.cell_grad(node)
            elif node.op.is_elementwise and len({x.key for x in node.inputs}) == \
                    len(node.inputs):
                self.elementwise(FusedGroup([node], node.inputs, [node]))
            else:
                raise Unsupported(f"{_name(ins)} has no launch here")

    def template(self):
        if self.output is not None:
            made = self.refs.get(self.output)
            if made is None or self.bases[made.base] != ("out",):
                raise Unsupported("the output is not written by a launch")
        return Template([len(self.names)] + self.code, self.holes, self.bases, self.blocks,
                        self.refs, self.names)

    def add_into(self, j, source, target):
        """Operand j's gradient ``source`` added into its rows of a gradient slab: ``target``
        (whether the rows are indexed, the columns of a view, the slab's row width)."""
        from ..cuda import windows

        indexed, columns, slab_width = target
        if source.ld is None or source.ndim > 2:
            raise Unsupported(f"gradient {j} is not rows")
        start = columns[0] if columns else 0
        if indexed:  # (atomic adds: a row read twice by the batch gets both terms)
            code = windows.scatter_source(((0, 0, 0, source.ld, source.width, start),),
                                          slab_width, source.dtype)
            args = [source, Ref(self.base(("tidx", j)), 0, *source[2:]),
                    Ref(self.base(("target", j)), 0, *source[2:])]
        else:
            code = _add_source(source.ld, source.width, slab_width, source.dtype)
            args = [source, Ref(self.base(("target", j)), start * source.dtype.itemsize,
                                *source[2:])]
        self.launch(windows.Launcher(code).kernel, source.width, args + [ROWS, _FIRST],
                    f"gradient {j} into its rows")

    # --- values --------------------------------------------------------------------------------

    def value(self, symbol):
        ref = self.refs.get(symbol.key)
        if ref is not None:
            return ref
        array = self.arrays.get(symbol.key)
        if array is None:
            raise Unsupported(f"{symbol.label()} is not made before it is read")
        if array.ndim < 2 and not array.flags.c_contiguous:  # (a product takes any layout)
            raise Unsupported(f"{symbol.label()} is not contiguous")
        ref = self.refs[symbol.key] = Ref(self.base(("fixed", symbol.key)), 0, None,
                                          array.shape[-1] if array.ndim else 1, array.dtype,
                                          array.ndim)
        return ref

    def made(self, node, width, dtype):
        """Where ``node``'s rows go: the batch's output rows, or its rows of a block."""
        shape = node.shape
        if row_domain(shape) != "vertex" or len(shape) > 2:
            raise Unsupported(f"{node.label()} is not a row per batch member")
        if np.dtype(dtype) not in cuda_kernels.DTYPES:
            raise Unsupported(f"{node.label()} is {np.dtype(dtype)}, not float32 or float64")
        thing = ("out",) if node.key == self.output else ("block", node.key)
        if thing != ("out",):
            self.blocks[node.key] = (width, np.dtype(dtype))
        ref = self.refs[node.key] = Ref(self.base(thing), 0, width, width, np.dtype(dtype),
                                        len(shape))
        return ref

    def hole(self, ref):
        """A stand-in for the address of ``ref``'s first row, found and filled per batch."""
        self.holes.append((ref.base, ref.offset))
        return _HOLE - len(self.holes)  # (hole j: _HOLE - 1 - j)

    def launch(self, kernel, width, args, name):
        """A LAUNCH of ``kernel`` (``width`` threads a row) with ``args``: refs (pointers),
        :data:`ROWS` (the batch's row count) or ints."""
        issuer.check_arguments(kernel, len(args))
        self.code += [issuer.LAUNCH, self.driver.function(kernel), width, len(args)]
        for arg in args:
            if arg is ROWS:
                self.code += [issuer.ROWS, 0, 0, 0]
            else:
                self.code += [issuer.CONST, self.hole(arg) if isinstance(arg, Ref) else int(arg),
                              0, 0]
        self.names.append(name)

    # --- launches ------------------------------------------------------------------------------

    def gather(self, k, ref, start, slab_width):
        from ..cuda import windows

        src, idx = self.base(("src", k)), self.base(("idx", k))
        source = windows.gather_source(((0, start, ref.width, 0, 0, ref.width, 0),),
                                       slab_width, ref.dtype)
        launcher = windows.Launcher(source)
        self.launch(launcher.kernel, source.row_width,
                    [Ref(src, 0, *ref[2:]), Ref(idx, 0, *ref[2:]), ref, ROWS, _FIRST],
                    f"operand {k}'s gather")

    def window(self, node):
        source = self.value(node.inputs[0])
        axis = node.attrs["axis"] % len(node.shape)
        if source.ld is None or axis != len(node.shape) - 1 or len(node.shape) != 2:
            raise Unsupported(f"{node.label()} is not a window of a batch's columns")
        start, stop = int(node.attrs["start"]), int(node.attrs["stop"])
        self.refs[node.key] = source._replace(
            offset=source.offset + start * source.dtype.itemsize, width=stop - start)

    def product(self, node):
        a, b = (self.value(x) for x in node.inputs)
        if a.ld is None or b.ld is not None or a.ndim != 2 or b.ndim != 2:
            raise Unsupported(f"product {node.label()} is not rows times a shared matrix")
        weight = self.arrays[node.inputs[1].key]
        out = self.made(node, weight.shape[1], a.dtype)
        # (pointer table slot 0 holds 0 and no row bytes are added: the offset is the address)
        at_a, at_b, at_out = ((0, 0, self.hole(x)) for x in (a, b, out))
        ops = products.row_product(self.driver, weight, a.dtype, at_a, a.ld, at_b, at_out,
                                   out.ld)
        if ops is None:
            raise Unsupported(f"product {node.label()}: operands cuBLAS cannot take as they are")
        self.code += ops
        self.names.append(f"product {node.label()}")

    def result(self, node, shape, dtype):
        """A whole array the shared operands' ∂ makes (a parameter's gradient)."""
        self.results[node.key] = (tuple(shape), np.dtype(dtype))
        self.results_of[node.key] = node.key
        ref = self.refs[node.key] = Ref(self.base(("result", node.key)), 0, None, shape[-1],
                                        np.dtype(dtype), len(shape))
        return ref

    def gemm_over_rows(self, a, op_a, lda, g, out, name):
        """``out = a·g`` summed over the batch's rows: ``a`` is rows read as columns (op_a,
        lda: cuBLAS's view of it), ``g`` rows; one gemm whose inner dimension is the rows."""
        dtype = issuer.gemm_dtype(g.dtype)
        if dtype is None or g.ndim != 2:
            raise Unsupported(f"{name}: operands cuBLAS cannot take as they are")
        at_a, at_g, at_out = ((0, 0, self.hole(x)) for x in (a, g, out))
        rows_out = self.results[self.results_of_ref(out)][0][0]
        self.code += [issuer.GEMM_INNER, dtype, blas.OP_N, op_a, g.width, rows_out, *at_g, g.ld,
                      *at_a, lda, *at_out, g.width]
        self.names.append(name)

    def results_of_ref(self, ref):
        return self.bases[ref.base][1]

    def product_over_rows(self, node):
        """Xᵀ·G: a shared weight's gradient over the batch's rows."""
        x, g = self.transposed[node.inputs[0].key], self.value(node.inputs[1])
        if g.ld is None or x.dtype != g.dtype or tuple(node.shape) != (x.width, g.width):
            raise Unsupported(f"product {node.label()} is not rows' transpose times rows")
        out = self.result(node, node.shape, g.dtype)
        self.gemm_over_rows(x, blas.OP_T, x.ld, g, out, f"product {node.label()}")

    def sum_over_rows(self, node):
        """A bias's gradient: the rows summed, as ones(1 x n)·G (one gemm, no reduction
        kernel: the ones are read as a 1 x n matrix, leading dimension 1)."""
        g = self.value(node.inputs[0])
        if g.ld is None or g.ndim != 2 or tuple(node.attrs.get("axes") or ()) != (0,) or \
                tuple(node.shape) != (1, g.width):
            raise Unsupported(f"{node.label()} is not a sum of the rows")
        out = self.result(node, node.shape, g.dtype)
        ones = Ref(self.base(("ones", g.dtype.str)), 0, None, 1, g.dtype, 1)
        self.gemm_over_rows(ones, blas.OP_T, 1, g, out, f"{node.label()} (over the rows)")

    def elementwise(self, group):
        from ..cuda import windows

        dtype = compute_dtype(group)
        try:
            source = elementwise_source(group, dtype)
        except KernelCompileError as why:  # (an op the generator has no C for: the interpreter)
            raise Unsupported(str(why).splitlines()[0]) from None
        out_shape = group.outputs[0].shape
        width = int(out_shape[-1]) if len(out_shape) == 2 else 1
        operands, args = [], []
        for x, (want, _, _) in zip(group.inputs, source.inputs):
            ref = self.value(x)
            if ref.dtype != np.dtype(want):
                raise Unsupported(f"{x.label()} is {ref.dtype}, the group reads {want}")
            if ref.ld is None:  # (one number for all, or a row: a bias)
                size = self.arrays[x.key].size
                if size != 1 and (ref.ndim != 1 or ref.width != width):
                    raise Unsupported(f"{x.label()} does not broadcast along the rows")
                operands.append(("shared", 0, 0, size != 1))
            elif tuple(x.shape[1:]) == tuple(out_shape[1:]):
                operands.append(("level", ref.ld, 0, True))
            elif tuple(x.shape[1:]) in ((1,), ()) and len(out_shape) == len(x.shape):
                operands.append(("level", ref.ld, 0, False))
            else:
                raise Unsupported(f"{x.label()} is not of the group's shape")
            args.append(ref)
        for o, (want, _, _) in zip(group.outputs, source.outputs):
            if tuple(o.shape) != tuple(out_shape):
                raise Unsupported(f"{o.label()}: a group's outputs of two shapes")
            ref = self.made(o, width, want)
            operands.append(("level", width, 0, True))
            args.append(ref)
        code = windows.level_source(source, tuple(operands), width)
        self.launch(windows.Launcher(code).kernel, width, args + [ROWS, _FIRST],
                    f"fused {'+'.join(m.op.name for m in group.members)}")

    def concat(self, node):
        from ..cuda import windows

        parts = [self.value(x) for x in node.inputs]
        if len(node.shape) != 2 or node.attrs["axis"] % 2 != 1 or any(
                p.ld is None or p.ndim != 2 or p.dtype != parts[0].dtype for p in parts):
            raise Unsupported(f"{node.label()} is not of rows' columns")
        width, dtype = sum(p.width for p in parts), parts[0].dtype
        out = self.made(node, width, dtype)
        source = _concat_source(tuple(p.width for p in parts), dtype)
        args = [x for p in parts for x in (p, p.ld)]
        self.launch(windows.Launcher(source).kernel, width, args + [out, ROWS, _FIRST],
                    f"{node.label()}")

    def cell(self, node, terms, pre_node=None):
        """An LSTM cell ``node`` on ``pre = sum(terms)``: with ``pre_node`` (a summed cell,
        ``executor.SummedCellStep``) the sum made and kept by the cell's kernel, else ``pre``
        the one term."""
        terms = [self.value(t) for t in terms]
        cells = [self.value(c) for c in node.inputs[1:]]
        rows = [t for t in terms if t.ld is not None]
        k = len(cells)
        if k > 2 or len(terms) not in ((1,) if pre_node is None else (2, 3)) or not rows or any(
                t.dtype != rows[0].dtype or (t.ld is None and t.ndim != 1)
                for t in terms + cells) or any(c.ld is None for c in cells):
            raise Unsupported(f"{node.label()}: an LSTM cell the kernel does not take")
        width, dtype = rows[0].width, rows[0].dtype
        H = width // (3 + k)
        out = self.made(node, 2 * H, dtype)
        cells = [x for c in cells for x in (c, c.ld)] + [rows[0], 0] * (2 - k)  # (unread)
        if pre_node is None:
            args, name = [rows[0], rows[0].ld], f"lstm_cell{k}"
        else:
            pre = self.made(pre_node, width, dtype)
            summed = [(t, 0 if t.ld is None else t.ld) for t in terms]
            summed += [summed[0]] * (3 - len(terms))  # (an absent third term: never read)
            args = [x for pair in summed for x in pair] + [len(terms), pre, pre.ld]
            name = f"lstm_cell_sum{k}"
        kernel = cuda_kernels._compiled(name, dtype.name, "cupy")
        self.launch(kernel, H, args + cells + [out, out.ld, ROWS, H], "the LSTM cell")

    def cell_grad(self, node):
        pre, *cells, out, g = (self.value(x) for x in node.inputs)
        k = len(cells)
        if k > 2 or any(x.ld is None or x.ndim != 2 or x.dtype != pre.dtype
                        for x in (pre, *cells, out, g)):
            raise Unsupported(f"{node.label()}: an LSTM cell the kernel does not take")
        H = pre.width // (3 + k)
        grads = self.made(node, (3 + 2 * k) * H, pre.dtype)
        cells = [x for c in cells for x in (c, c.ld)] + [pre, 0] * (2 - k)  # (unread)
        kernel = cuda_kernels._compiled(f"lstm_cell_grad{k}", pre.dtype.name, "cupy")
        self.launch(kernel, H, [pre, pre.ld, *cells, out, out.ld, g, g.ld, grads, grads.ld,
                                ROWS, H], "the LSTM cell's gradient")


@functools.lru_cache(maxsize=None)
def _add_source(ld, width, out_ld, dtype):
    """A kernel adding rows of ``width`` columns (``ld`` apart) into rows ``out_ld`` apart."""
    from ..cuda import windows

    t, suffix = cuda_kernels.DTYPES[np.dtype(dtype)]
    return windows._layout_source(
        f"minicavs_add_rows_{suffix}_{ld}_{width}_{out_ld}",
        [f"const {t}* __restrict__ x", f"{t}* __restrict__ out"],
        f"        out[i * {out_ld} + j] += x[i * {ld} + j];", width)


@functools.lru_cache(maxsize=None)
def _concat_source(widths, dtype):
    """A kernel writing rows of its parts' ``widths`` side by side (each part a pointer and
    its row width, parameters)."""
    from ..cuda import windows

    t, suffix = cuda_kernels.DTYPES[np.dtype(dtype)]
    width = sum(widths)
    params = [f"const {t}* __restrict__ x{k}, const long long ld{k}" for k in range(len(widths))]
    pieces = "\n".join(f"        if (j < {w}) {{ out[i * {width} + c + j] = x{k}[i * ld{k} + j]; "
                       f"continue; }}\n        j -= {w}; c += {w};" for k, w in enumerate(widths))
    return windows._layout_source(
        f"minicavs_concat_{suffix}_{windows._digest(widths)}", params + [f"{t}* __restrict__ out"],
        "        long long c = 0;\n" + pieces, width)


ROWS = object()  # (an argument: the batch's row count)
_FIRST = 0  # (a batch's first row, as the level kernels take one: its own rows start at 0)
_HOLE = -(1 << 40)  # (hole j is written _HOLE - j - 1 until the template is made)


def _name(ins):
    node = getattr(getattr(ins, "step", None), "node", None)
    return node.label() if node is not None else type(ins).__name__
