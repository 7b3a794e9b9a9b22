"""A fused elementwise group run as one native loop over NumPy arrays.

The passes fuse linked elementwise ops into groups; inside a native level loop a group is
already one loop (``runtime/codegen.py``), but a group run over whole arrays — an eager or lazy
step of a vertex function (all of a recursive definition's leaf kind: its gates), an interpreted
level — ran as one NumPy call per member. Here it is one loop whose body is the C every backend
runs for the group (``csource.elementwise_source``, from the ops' ``c_expr``): rows split
between the native team inside a call of native loops, columns vectorised.

The output is seen as ``(rows, cols)`` (its last axis the columns); each input is read as one
of four layouts — rows of ``cols`` at a row stride (the whole array, or a column window of a
wider one: a gate of ``split``), one value, a row of ``cols`` (a bias), a column of ``rows`` (a
per-row factor). Anything else (another broadcast, a column stride, another dtype, a group the
C generator does not take) returns None and the caller's NumPy kernel runs. An output is
written whole or as a column window of a wider array (its columns of a concat's buffer). One
library per group signature, dtype and input layouts, compiled once and cached on disk
(``cpu/build.py``).
"""

import ctypes
import threading

import numpy as np

from . import build, calibrate, kernels, team
from ..csource import elementwise_source
from ..errors import KernelCompileError

WHOLE, ONE, ROW, COLUMN = "whole", "one", "row", "column"
# Elements from which the native loop runs: below, the NumPy calls cost less than preparing
# the native one (measured: the ctypes call and its arguments are ~10 us).
MIN_ELEMENTS = 1 << 13

_lock = threading.Lock()
_loops = {}  # (source name, layouts) -> ctypes function, or None (does not compile)


def source_for(group, dtype):
    """The group's :class:`~minicavs.csource.ElementwiseSource` in ``dtype``, or None
    where native code cannot run it (no compiler, a dtype or op the generator does not take)."""
    if build.unavailable() is not None:
        return None
    try:
        return elementwise_source(group, dtype)
    except KernelCompileError:
        return None


def run(source, inputs, outs=None):
    """The group's outputs computed by its native loop (written into ``outs`` where given), or
    None where the inputs' layouts or dtypes are not the loop's (the caller runs NumPy)."""
    if not all(isinstance(a, np.ndarray) for a in inputs) or len(inputs) != len(source.inputs):
        return None
    try:
        shape = np.broadcast_shapes(*(a.shape for a in inputs))
    except ValueError:
        return None
    size = int(np.prod(shape, dtype=np.int64))
    if size < MIN_ELEMENTS:
        return None
    cols = shape[-1] if shape else 1
    rows = size // cols if cols else 0
    layouts, strides = [], []
    for a, (dtype, _, _) in zip(inputs, source.inputs):
        found = _layout(a, shape, cols)
        if found is None or a.dtype != np.dtype(dtype):
            return None
        layouts.append(found[0])
        strides.append(found[1])
    results = []
    for k, (dtype, _, _) in enumerate(source.outputs):
        given = outs[k] if outs else None
        if given is None:
            given = np.empty(shape, dtype)
            strides.append(cols)
        else:  # whole, or a column window of a wider array (its columns of a concat)
            found = _layout(given, shape, cols) if isinstance(given, np.ndarray) else None
            if found is None or found[0] != WHOLE or given.dtype != np.dtype(dtype):
                return None
            strides.append(found[1])
        results.append(given)
    loop = _loop(source, tuple(layouts))
    if loop is None:
        return None
    pointers = (ctypes.c_void_p * (len(inputs) + len(results)))(
        *[kernels.data_address(a) for a in inputs],
        *[kernels.data_address(r) for r in results])
    # (rows split between the team inside a call of native loops, from the work it pays)
    threads = calibrate.threads_for(size) if team.in_team_products() else 1
    loop(ctypes.c_int64(rows), ctypes.c_int64(cols), pointers,
         np.asarray(strides, dtype=np.int64).ctypes.data_as(ctypes.c_void_p),
         ctypes.c_int64(threads))
    return tuple(results)


def _layout(a, shape, cols):
    """``(layout, row stride in elements)`` of ``a`` read against an output of ``shape``
    whose rows have ``cols`` elements, or None."""
    item = a.itemsize
    if a.size == 1:
        return ONE, 0
    if kernels.data_address(a) % item or any(s % item for s in a.strides):
        return None
    if a.shape == shape:
        if a.flags.c_contiguous:
            return WHOLE, cols
        if a.ndim == 2 and a.strides[1] == item and a.strides[0] >= cols * item:
            return WHOLE, a.strides[0] // item  # a column window of a wider array
        return None
    squeezed = a.shape[next((i for i, n in enumerate(a.shape) if n != 1), a.ndim):]
    if shape and squeezed == shape[-1:] and (a.flags.c_contiguous or a.strides[-1] == item):
        return ROW, 0  # (..., 1, C) against (..., R, C)
    if len(a.shape) == len(shape) and a.shape[-1] == 1 and a.shape[:-1] == shape[:-1] \
            and (a.ndim == 2 or a.flags.c_contiguous):
        return COLUMN, (a.strides[0] // item if a.ndim == 2 else 1)  # (..., R, 1)
    return None


def _loop(source, layouts):
    key = (source.name, layouts)
    with _lock:
        if key not in _loops:
            try:
                lib, _ = build.build(_source(source, layouts), "fused",
                                     origin=f"fused group ({' '.join(source.ops)})")
                function = lib.minicavs_fused
                function.restype = None
                function.argtypes = [ctypes.c_int64, ctypes.c_int64,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                     ctypes.c_int64]
            except Exception:  # noqa: BLE001 (a group the C++ compiler refuses stays on NumPy)
                function = None
            _loops[key] = function
        return _loops[key]


_READ = {WHOLE: "r * ld{k} + j", ONE: "0", ROW: "j", COLUMN: "r * ld{k}"}


def _source(source, layouts):
    n = len(source.inputs)
    pointers = [f"const {ctype} *__restrict__ a{k} = (const {ctype} *)p[{k}];"
                for k, (_, ctype, _) in enumerate(source.inputs)]
    pointers += [f"{ctype} *__restrict__ b{k} = ({ctype} *)p[{n + k}];"
                 for k, (_, ctype, _) in enumerate(source.outputs)]
    pointers += [f"const int64_t ld{k} = ld[{k}];" for k in range(n)]
    pointers += [f"const int64_t ldo{k} = ld[{n + k}];" for k in range(len(source.outputs))]
    loads = [f"const {ctype} x{k} = a{k}[{_READ[layout].format(k=k)}];"
             for k, ((_, ctype, _), layout) in enumerate(zip(source.inputs, layouts))]
    declare = [f"{ctype} y{k};" for k, (_, ctype, _) in enumerate(source.outputs)]
    stores = [f"b{k}[r * ldo{k} + j] = y{k};" for k in range(len(source.outputs))]
    body = "\n".join(loads + declare + [source.operation] + stores)
    indented = "\n".join("      " + line for line in body.splitlines())
    return f"""// minicavs fused group {source.name} ({' '.join(source.ops)}), inputs {', '.join(layouts)}
// (minicavs/cpu/fused.py)
#include <cmath>
#include <cstdint>
#include <omp.h>
using std::exp; using std::log; using std::tanh; using std::sqrt; using std::pow;
{source.preamble or f"typedef {dict(float32='float', float64='double')[source.dtype]} T;"}
extern "C" void minicavs_fused(int64_t rows, int64_t cols, void *const *p, const int64_t *ld,
                               int64_t threads) {{
  {chr(10).join('  ' + line for line in pointers).lstrip()}
  #pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1)
  for (int64_t r = 0; r < rows; ++r) {{
    #pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {{
{indented}
    }}
  }}
}}
"""
