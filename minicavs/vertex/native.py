"""An input graph's arrays from its child lists in one C pass (``InputGraph``'s common case).

A parsed tree arrives as Python lists of ints, children before parents; turning them into CSR
arrays, levels and roots took about 26 µs a 39-vertex SST tree in NumPy and Python (a dozen
small NumPy calls and a loop over the vertices), 0.22 s for SST's 8,544 trees: the largest
part of a first epoch's excess over a later one, whose graphs are made already (the same on a
GPU, where an epoch of Tree-LSTM-256 takes 0.8 s). Here it is one pass over the lists.

Only that common form is taken — a list or tuple of lists or tuples of Python ints, each child
in ``0 .. v - 1`` for vertex ``v`` — and :func:`ordered_child_lists` returns None for anything
else (another numbering, NumPy ints, ranges, a bad child), which ``graphs.py`` handles as before
and where its errors name what is wrong. Compiled like the autobatch recorder (``cpu/build.py``
with the interpreter's headers); without native code every graph takes the Python path.
"""

import ctypes
import functools
import os
import sysconfig

import numpy as np

from ..cpu import build

_SOURCE = r"""// minicavs: an input graph's arrays from ordered child lists (minicavs/vertex/native.py)
#include <Python.h>

#include <cstdint>
#include <vector>

namespace {
PyObject *int64_bytes(Py_ssize_t count, int64_t **data) {
  PyObject *bytes = PyBytes_FromStringAndSize(nullptr, count * (Py_ssize_t)sizeof(int64_t));
  if (bytes) *data = reinterpret_cast<int64_t *>(PyBytes_AS_STRING(bytes));
  return bytes;
}

inline bool is_list(PyObject *o) { return PyList_CheckExact(o) || PyTuple_CheckExact(o); }
}  // namespace

// (child_ptr, child_ids, level, roots, num_children) as int64 bytes, or None where ``children`` is not a
// list or tuple of lists or tuples of Python ints with every child below its parent.
extern "C" PyObject *minicavs_ordered_child_lists(PyObject *children) {
  if (!is_list(children)) Py_RETURN_NONE;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(children);
  if (n == 0) Py_RETURN_NONE;
  PyObject **lists = PySequence_Fast_ITEMS(children);
  Py_ssize_t edges = 0;
  for (Py_ssize_t v = 0; v < n; ++v) {
    if (!is_list(lists[v])) Py_RETURN_NONE;
    edges += PySequence_Fast_GET_SIZE(lists[v]);
  }
  int64_t *ptr, *ids, *level, *roots, *counts;
  PyObject *ptr_b = int64_bytes(n + 1, &ptr), *ids_b = int64_bytes(edges, &ids),
           *level_b = int64_bytes(n, &level), *counts_b = int64_bytes(n, &counts);
  std::vector<char> has_parent(n, 0);
  PyObject *roots_b = nullptr;
  if (!ptr_b || !ids_b || !level_b || !counts_b) goto fail;
  ptr[0] = 0;
  for (Py_ssize_t v = 0, at = 0; v < n; ++v) {
    PyObject *kids = lists[v];
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(kids);
    PyObject **items = PySequence_Fast_ITEMS(kids);
    int64_t top = -1;
    for (Py_ssize_t j = 0; j < count; ++j) {
      if (!PyLong_CheckExact(items[j])) goto other;
      int overflow = 0;
      const long long c = PyLong_AsLongLongAndOverflow(items[j], &overflow);
      if (overflow || c < 0 || c >= v) goto other;
      ids[at++] = c;
      has_parent[c] = 1;
      if (level[c] > top) top = level[c];
    }
    level[v] = top + 1;
    counts[v] = count;
    ptr[v + 1] = at;
  }
  {
    Py_ssize_t count = 0;
    for (Py_ssize_t v = 0; v < n; ++v) count += !has_parent[v];
    roots_b = int64_bytes(count, &roots);
    if (!roots_b) goto fail;
    for (Py_ssize_t v = 0, k = 0; v < n; ++v)
      if (!has_parent[v]) roots[k++] = v;
  }
  return Py_BuildValue("(NNNNN)", ptr_b, ids_b, level_b, roots_b, counts_b);
other:  // not the common form: the Python path checks it (and names what is wrong)
  Py_XDECREF(ptr_b); Py_XDECREF(ids_b); Py_XDECREF(level_b); Py_XDECREF(counts_b);
  Py_RETURN_NONE;
fail:
  Py_XDECREF(ptr_b); Py_XDECREF(ids_b); Py_XDECREF(level_b); Py_XDECREF(counts_b);
  Py_XDECREF(roots_b);
  return nullptr;
}
"""


def ordered_child_lists(children):
    """``(child_ptr, child_ids, level, roots, num_children)``, read-only int64 arrays, of
    ``children`` in the common form (see the module docstring), or None: another form, or no
    native code here."""
    function = _build()[0]
    found = None if function is None else function(children)
    return None if found is None else tuple(np.frombuffer(b, np.int64) for b in found)


def unavailable():
    """Why graphs are made in Python only here (``python -m minicavs doctor``), or None."""
    return _build()[1]


@functools.lru_cache(maxsize=None)
def _build():
    include = sysconfig.get_paths().get("include")
    reason = build.unavailable()
    if reason is not None:
        return None, reason
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return None, f"the interpreter's C headers (Python.h) are not in {include!r}"
    try:
        lib = build.python_library(_SOURCE, "graphs", include, "minicavs/vertex/native.py")
    except Exception as exc:  # (the Python path makes every graph: only slower)
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    function = lib.minicavs_ordered_child_lists
    function.restype = ctypes.py_object
    function.argtypes = [ctypes.py_object]
    return function, None
