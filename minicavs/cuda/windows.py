"""A level's row moves as one launch each: gathers into column windows, scatter-adds out of them.

F's entrance on a level is the rows of every child slot copied out of the scattered state; its
readers are mostly column windows (the Tree-LSTM's ``h_l, c_l = split(gather(0), 2)``) that
live in batch buffers (``h_l`` in its columns of the product's input ``[h_l, h_r]``, ``c_l`` in
the buffer ∂F reads). :func:`gather_windows` copies each window's columns of the children's rows
straight into the rows it owns, every slot in one launch: no gathered block, no copy per window.
∂F's exit is the mirror: :func:`scatter_add_windows` adds the parts of each slot's
concatenated gradient (``[dh, dc]``) into their columns of the children's state gradient rows,
every slot in one launch, so the concatenation is never made.

A launch is described by a *layout* (a tuple of pieces, fixed for a Program) and the kernel
source is generated per layout and dtype, its columns and row widths written in as constants,
and cached (few layouts per model: one per set of slots a level has):

* gather piece ``(slot, src_col, width, dst, dst_col, dst_width, batch)``:
  ``dsts[dst][row, dst_col + j] = src[idx[slot][lo + i], src_col + j]`` (zeros for -1), the
  row ``lo + i`` of a batch-wide destination (``batch`` 1) or ``i`` of the level's own (0);
* scatter piece ``(slot, src, src_col, src_width, width, dst_col)``:
  ``out[idx[slot][lo + i], dst_col + j] += srcs[src][i, src_col + j]`` (atomic; -1 dropped).

``lo`` is the level's first row: the index arrays and destinations are the whole batch's, so a
level passes pointers it already has. Index -1 reads zeros / adds nothing, as the row kernels
of ``kernels.py`` do; the NumPy twins (``*_numpy``) are the reference semantics.
"""

import functools
import hashlib
from collections import namedtuple
from string import Template

import numpy as np

from . import ahead, kernels

_HEAD = """
extern "C" __global__ void ${name}(${params}, const long long n, const long long lo)
{
    const long long total = n * ${width};
    ${loop} {
        const long long i = e / ${width};
        long long j = e - i * ${width};
${pieces}
    }
}
"""

_GATHER_PIECE = """        if (j < ${width}) {
            const int r = idx${slot}[lo + i];
            dst${dst}[(${row}) * ${dst_width} + ${dst_col} + j] =
                r < 0 ? (${T})0 : src[(long long)r * ${src_width} + ${src_col} + j];
            continue;
        }
        j -= ${width};"""

_SCATTER_PIECE = """        if (j < ${width}) {
            const int r = idx${slot}[lo + i];
            if (r >= 0)
                atomicAdd(&out[(long long)r * ${out_width} + ${dst_col} + j],
                          src${src}[i * ${src_width} + ${src_col} + j]);
            continue;
        }
        j -= ${width};"""


LayoutSource = namedtuple("LayoutSource", "name code row_width")  # (elements moved per row)


def _digest(key):
    return hashlib.sha1(repr(key).encode()).hexdigest()[:10]


def _layout_source(name, params, pieces, width, prelude=""):
    """``LayoutSource`` of kernel ``name``: :data:`_HEAD` over rows of ``width`` elements."""
    code = Template(_HEAD).substitute(name=name, params=", ".join(params), width=width,
                                      loop=kernels._GRID_STRIDE, pieces=pieces)
    return LayoutSource(name, prelude + code, width)


@functools.lru_cache(maxsize=None)
def _operands(layout, slot_at, array_at):
    """The slots and the arrays a layout reads, in parameter order."""
    return sorted({p[slot_at] for p in layout}), sorted({p[array_at] for p in layout})


@functools.lru_cache(maxsize=None)
def gather_source(layout, src_width, dtype):
    """The CUDA source of a gather layout: ``LayoutSource(name, code, row_width)``."""
    t, suffix = kernels.DTYPES[np.dtype(dtype)]
    slots, dsts = _operands(layout, 0, 3)
    params = [f"const {t}* __restrict__ src"] + [
        f"const int* __restrict__ idx{s}" for s in slots] + [f"{t}* __restrict__ dst{d}"
                                                             for d in dsts]
    pieces = "\n".join(Template(_GATHER_PIECE).substitute(
        slot=s, width=w, dst=d, dst_col=dc, dst_width=dw, src_col=sc, src_width=src_width, T=t,
        row="lo + i" if batch else "i") for s, sc, w, d, dc, dw, batch in layout)
    name = f"minicavs_gather_windows_{suffix}_{_digest((layout, src_width))}"
    return _layout_source(name, params, pieces, sum(p[2] for p in layout))


@functools.lru_cache(maxsize=None)
def scatter_source(layout, out_width, dtype):
    """The CUDA source of a scatter-add layout: ``LayoutSource(name, code, row_width)``."""
    t, suffix = kernels.DTYPES[np.dtype(dtype)]
    slots, srcs = _operands(layout, 0, 1)
    params = [f"const {t}* __restrict__ src{s}" for s in srcs] + [
        f"const int* __restrict__ idx{s}" for s in slots] + [f"{t}* __restrict__ out"]
    pieces = "\n".join(Template(_SCATTER_PIECE).substitute(
        slot=s, src=src, src_col=sc, src_width=sw, width=w, dst_col=dc, out_width=out_width)
        for s, src, sc, sw, w, dc in layout)
    name = f"minicavs_scatter_add_windows_{suffix}_{_digest((layout, out_width))}"
    return _layout_source(name, params, pieces, sum(p[4] for p in layout),
                          kernels._DOUBLE_ATOMIC_ADD)


@functools.lru_cache(maxsize=None)
def zero_source(width, ld, dtype):
    """The CUDA source that writes zeros into a level's rows of a buffer, given at the level's
    first row (``width`` elements of each row, rows ``ld`` apart)."""
    t, suffix = kernels.DTYPES[np.dtype(dtype)]
    return _layout_source(f"minicavs_zero_rows_{suffix}_{width}_{ld}",
                          [f"{t}* __restrict__ out"], f"        out[i * {ld} + j] = ({t})0;",
                          width)


@functools.lru_cache(maxsize=None)
def level_source(source, operands, width):
    """A fused group's body (``source``: a ``csource.ElementwiseSource``) over a level's rows of
    whole arrays, ``width`` elements a row, launched like the layouts' kernels (arrays, then
    ``n`` and ``lo``): no row view or column window is made for it. ``operands``, per input
    then output of the group:
    ``(kind, row_width, column, per_column)``; its element (i, j) of the level is
    ``[(lo + i) * row_width + column + j]`` of a batch-wide array (``"batch"``),
    ``[i * row_width + column + j]`` of the level's own rows (``"level"``), ``[column + j]``
    of a shared array (``"shared"``), or 0 (``"zero"``: no parameter); without ``per_column``
    the ``+ j`` is dropped (a column or a scalar, broadcast along the row)."""
    named, params, loads = source.inputs + source.outputs, [], []
    for k, ((_, t, name), (kind, row_width, column, per_column)) in enumerate(
            zip(named, operands)):
        if kind == "zero":
            loads.append(f"        const {t} {name} = ({t})0;")
            continue
        row = {"batch": "(lo + i)", "level": "i", "shared": "0"}[kind]
        at = f"{row} * {row_width} + {column}" + (" + j" if per_column else "")
        if k < len(source.inputs):
            params.append(f"const {t}* __restrict__ {name}__raw")
            loads.append(f"        const {t} {name} = {name}__raw[{at}];")
        else:
            params.append(f"{t}* __restrict__ {name}__raw")
            loads.append(f"        {t}& {name} = {name}__raw[{at}];")
    body = "\n".join("        " + line for line in source.operation.splitlines())
    return _layout_source(f"{source.name}_level_{_digest((operands, width))}", params,
                          "\n".join(loads) + "\n" + body, width,
                          f"typedef {kernels.DTYPES[np.dtype(source.dtype)][0]} T;\n")


@functools.lru_cache(maxsize=None)
def tensor_source(source, operands, shape, summed=()):
    """An elementwise body (``source``: a ``csource.ElementwiseSource`` of one output) over
    each row's elements of ``shape`` on a level (the per-row tensors of a (V, a, b, ...)
    value), its output summed over the row's axes ``summed`` (none: every element written).
    ``operands``, per input then the output: ``(ld, steps)``, the element at ``u0, u1, ...``
    of row i being ``[i * ld + u0 * steps[0] + ...]`` from the level's first row (step 0
    along a broadcast axis, and along a summed axis for the output), or None (an input that
    is 0: no parameter). One thread per output element; a summed axis is its loop."""
    (_, t_out, _), = source.outputs
    kept = [d for d in range(len(shape)) if d not in summed]
    lines = []
    for d in reversed(kept):  # (the output element j of a row: its index along each kept axis)
        lines.append(f"const long long u{d} = j;" if d == kept[0] else
                     f"const long long u{d} = j % {shape[d]}; j /= {shape[d]};")

    def at(ld, steps):
        return " + ".join([f"i * {ld}"] + [f"u{d} * {s}" for d, s in enumerate(steps) if s])

    params, loads = [], []
    for (_, t, name), operand in zip(source.inputs, operands):
        if operand is None:
            loads.append(f"const {t} {name} = ({t})0;")
        else:
            params.append(f"const {t}* __restrict__ {name}__raw")
            loads.append(f"const {t} {name} = {name}__raw[{at(*operand)}];")
    params.append(f"{t_out}* __restrict__ y0__raw")
    out = f"y0__raw[{at(*operands[-1])}]"
    if summed:
        lines.append(f"{t_out} total_ = 0;")
        for d in summed:
            lines.append(f"for (long long u{d} = 0; u{d} < {shape[d]}; ++u{d})")
        lines += ["{"] + ["    " + x for x in loads + [f"{t_out} y0;"]
                          + source.operation.splitlines() + ["total_ += y0;"]]
        lines += ["}", f"{out} = total_;"]
    else:
        lines += loads + [f"{t_out}& y0 = {out};"] + source.operation.splitlines()
    kept_size = int(np.prod([shape[d] for d in kept], dtype=np.int64))
    name = f"minicavs_row_tensor_{kernels.DTYPES[np.dtype(source.dtype)][1]}_" \
           f"{_digest((source.name, operands, shape, summed))}"
    return _layout_source(name, params, "\n".join("        " + x for x in lines), kept_size,
                          f"typedef {kernels.DTYPES[np.dtype(source.dtype)][0]} T;\n")


@functools.lru_cache(maxsize=None)
def _compiled(source, runner):
    return kernels.make_kernel(source.code, source.name, runner)


class Launcher:
    """One layout's kernel, ready to launch on a level: ``launcher(arrays, n, lo)`` with the
    arrays in parameter order (what a level loop calls, its layouts fixed per plan)."""

    def __init__(self, source, runner="cupy"):
        self.kernel, self.row_width = _compiled(source, runner), source.row_width

    def __call__(self, arrays, n, lo):
        total = n * self.row_width
        if total:
            blocks = min(-(-total // kernels.BLOCK_SIZE), kernels.MAX_BLOCKS)
            ahead.ready(self.kernel)((blocks,), (kernels.BLOCK_SIZE,),
                                     (*arrays, np.int64(n), np.int64(lo)))


# --- gathers ------------------------------------------------------------------------------------

def gather_windows_numpy(src, idx, dsts, layout, n, lo):
    """NumPy twin of :func:`gather_windows`."""
    for slot, src_col, width, dst, dst_col, _, batch in layout:
        rows = idx[slot][lo:lo + n]
        block = np.where((rows >= 0)[:, None], src[rows, src_col:src_col + width], 0)
        first = lo if batch else 0
        dsts[dst][first:first + n, dst_col:dst_col + width] = block


def gather_windows(src, idx, dsts, layout, n, lo, runner=None):
    """Rows ``lo..lo+n`` of each destination window from the children's rows of ``src``, all
    pieces of ``layout`` in one launch. ``src``: the (N, S) state; ``idx``: per slot, the whole
    batch's (rows,) int32 child rows (a dict or list indexed by slot); ``dsts``: C-contiguous 2-D
    arrays indexed by a piece's ``dst``. The caller checks the indices once per batch."""
    runner = runner or ("cupy" if kernels._is_cupy(src) else "numpy")
    if runner == "numpy":
        return gather_windows_numpy(src, idx, dsts, layout, n, lo)
    source = gather_source(layout, src.shape[1], src.dtype)
    slots, targets = _operands(layout, 0, 3)
    Launcher(source, runner)((src, *[idx[s] for s in slots], *[dsts[d] for d in targets]), n, lo)


# --- scatter-adds -------------------------------------------------------------------------------

def scatter_add_windows_numpy(srcs, idx, out, layout, n, lo):
    """NumPy twin of :func:`scatter_add_windows` (pieces in order, rows in index order)."""
    for slot, src, src_col, _, width, dst_col in layout:
        rows = idx[slot][lo:lo + n]
        present = rows >= 0
        np.add.at(out[:, dst_col:dst_col + width], rows[present],
                  srcs[src][:n][present, src_col:src_col + width])


def scatter_add_windows(srcs, idx, out, layout, n, lo, runner=None):
    """Add each piece's columns of the level's rows ``srcs[src]`` (C-contiguous (n, width)
    arrays) into its columns of the children's rows of ``out``, all pieces in one launch."""
    runner = runner or ("cupy" if kernels._is_cupy(out) else "numpy")
    if runner == "numpy":
        return scatter_add_windows_numpy(srcs, idx, out, layout, n, lo)
    source = scatter_source(layout, out.shape[1], out.dtype)
    slots, parts = _operands(layout, 0, 1)
    Launcher(source, runner)((*[srcs[s] for s in parts], *[idx[s] for s in slots], out), n, lo)
