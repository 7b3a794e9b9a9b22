"""The vertex front-end's host work on graphs in C: an input graph's arrays from its child
lists, and a batch's schedule from its graphs, each in one pass.

* :func:`ordered_child_lists` — a parsed tree arrives as Python lists of ints, children before
  parents; its CSR arrays, levels and roots took about 26 µs a 39-vertex SST tree in NumPy and
  Python (a dozen small NumPy calls and a loop over the vertices), 0.22 s for SST's 8,544
  trees, most of a first epoch's excess over a later one (whose graphs are made already).
  Only that common form is taken — a list or tuple of lists or tuples of Python ints, each
  child in ``0 .. v - 1`` for vertex ``v``; for anything else (another numbering, NumPy ints,
  ranges, a bad child) it returns None, and ``graphs.py`` checks the input as before and names
  what is wrong.
* :func:`batch_schedule` — ``GraphBatch``'s concatenation and level schedule (rows level by
  level, the edges in their parents' row order) took about 0.45 ms a batch of 64 SST trees,
  some thirty NumPy calls and five lists over the graphs: 60 ms an SST epoch, which on a GPU
  is 8 % of a Tree-LSTM-256 epoch. Here it is a counting sort and one pass over the edges;
  where a graph has no levels yet, NumPy's path makes them (and the graph keeps them).

Compiled like the autobatch recorder (``cpu/build.py``, with the interpreter's headers);
without native code graphs and batches take the NumPy path, only slower.
"""

import ctypes
import functools

import numpy as np

from .. import backend
from ..cpu import build
from ..errors import ArgumentError

_SOURCE = r"""// minicavs: input graphs' arrays and batches' schedules (minicavs/vertex/native.py)
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

// (child_ptr, child_ids, level, roots, num_children) as int64 bytes, or None where
// ``children`` is not a list or tuple of lists or tuples of Python ints, each child below its
// parent.
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

namespace {
// An int64 array attribute of a graph, C-contiguous (a view held until released), or false.
bool int64_view(PyObject *graph, PyObject *name, Py_buffer *view) {
  PyObject *array = PyObject_GetAttr(graph, name);
  if (!array) { PyErr_Clear(); return false; }
  const int got = PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT);
  Py_DECREF(array);
  if (got) { PyErr_Clear(); return false; }
  const char *f = view->format;
  if (view->itemsize != 8 || view->ndim != 1 || !f || (f[0] != 'l' && f[0] != 'q') || f[1]) {
    PyBuffer_Release(view);
    return false;
  }
  return true;
}

inline int64_t *at(Py_buffer &view) { return static_cast<int64_t *>(view.buf); }
}  // namespace

// A batch's schedule (graphs.GraphBatch: _build and _schedule) from its graphs' own arrays
// and levels: (offsets, child_ptr, child_ids, roots, sample_of, level, order, row_of,
// level_offsets, edge_parent_row, edge_child_row, edge_slot, edge_level_offsets,
// edge_parent_local) as int64 bytes, then num_levels and is_forest; None where a graph has no
// levels yet or an array is not int64 (the NumPy path makes it).
extern "C" PyObject *minicavs_batch_schedule(PyObject *graphs, PyObject *names) {
  if (!PyList_CheckExact(graphs) || !PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != 4)
    Py_RETURN_NONE;
  const Py_ssize_t G = PyList_GET_SIZE(graphs);
  std::vector<Py_buffer> views(4 * G);
  Py_ssize_t held = 0, n = 0, e = 0, r = 0;
  PyObject *result = nullptr;
  for (Py_ssize_t g = 0; g < G; ++g, held += 4) {  // child_ptr, child_ids, _level, roots
    bool ok = true;
    for (int k = 0; k < 4 && ok; ++k) {
      ok = int64_view(PyList_GET_ITEM(graphs, g), PyTuple_GET_ITEM(names, k), &views[held + k]);
      if (!ok) for (int j = 0; j < k; ++j) PyBuffer_Release(&views[held + j]);
    }
    if (!ok) goto release;
    const Py_ssize_t v = views[held + 2].shape[0];
    if (views[held].shape[0] != v + 1 || views[held + 1].shape[0] != at(views[held])[v]) {
      for (int j = 0; j < 4; ++j) PyBuffer_Release(&views[held + j]);
      goto release;
    }
    n += v;
    e += views[held + 1].shape[0];
    r += views[held + 3].shape[0];
  }
  if (n == 0) goto release;
  {
    int64_t *offsets, *ptr, *ids, *roots, *sample_of, *level, *order, *row_of, *level_offsets,
        *e_parent, *e_child, *e_slot, *e_level_offsets, *e_local;
    PyObject *made[14] = {
        int64_bytes(G + 1, &offsets), int64_bytes(n + 1, &ptr), int64_bytes(e, &ids),
        int64_bytes(r, &roots), int64_bytes(n, &sample_of), int64_bytes(n, &level),
        int64_bytes(n, &order), int64_bytes(n, &row_of), nullptr, int64_bytes(e, &e_parent),
        int64_bytes(e, &e_child), int64_bytes(e, &e_slot), nullptr, int64_bytes(e, &e_local)};
    // the graphs one after another, their vertex ids shifted by the vertices before them
    int64_t top = 0;
    Py_ssize_t vn = 0, en = 0, rn = 0;
    offsets[0] = 0;
    ptr[0] = 0;
    for (Py_ssize_t g = 0; g < G; ++g) {
      const int64_t *gp = at(views[4 * g]), *gi = at(views[4 * g + 1]),
                    *gl = at(views[4 * g + 2]), *gr = at(views[4 * g + 3]);
      const Py_ssize_t gv = views[4 * g + 2].shape[0], ge = views[4 * g + 1].shape[0];
      for (Py_ssize_t v = 0; v < gv; ++v) {
        ptr[vn + v + 1] = en + gp[v + 1];
        level[vn + v] = gl[v];
        sample_of[vn + v] = g;
        if (gl[v] > top) top = gl[v];
      }
      for (Py_ssize_t j = 0; j < ge; ++j) ids[en + j] = gi[j] + vn;
      for (Py_ssize_t j = 0; j < views[4 * g + 3].shape[0]; ++j) roots[rn + j] = gr[j] + vn;
      vn += gv;
      en += ge;
      rn += views[4 * g + 3].shape[0];
      offsets[g + 1] = vn;
    }
    const Py_ssize_t L = top + 1;
    made[8] = int64_bytes(L + 1, &level_offsets);
    made[12] = int64_bytes(L + 1, &e_level_offsets);
    bool is_forest = true;
    for (auto *m : made) if (!m) goto fail;
    {
      // rows level by level, vertices in id order within a level (a stable sort by level)
      std::vector<int64_t> next(L + 1, 0);
      for (Py_ssize_t v = 0; v < n; ++v) ++next[level[v] + 1];
      for (Py_ssize_t t = 0; t < L; ++t) next[t + 1] += next[t];
      for (Py_ssize_t t = 0; t <= L; ++t) level_offsets[t] = next[t];
      for (Py_ssize_t v = 0; v < n; ++v) {
        const int64_t row = next[level[v]]++;
        order[row] = v;
        row_of[v] = row;
      }
      // edges in their parents' row order, each parent's in slot order
      std::vector<char> has_parent(n, 0);
      Py_ssize_t k = 0, t = 0;
      for (Py_ssize_t row = 0; row < n; ++row) {
        while (t <= L - 1 && level_offsets[t] <= row) e_level_offsets[t++] = k;
        const int64_t v = order[row], first = level_offsets[level[v]];
        for (int64_t j = ptr[v]; j < ptr[v + 1]; ++j, ++k) {
          const int64_t c = ids[j];
          e_parent[k] = row;
          e_child[k] = row_of[c];
          e_slot[k] = j - ptr[v];
          e_local[k] = row - first;
          if (has_parent[c]) is_forest = false;
          has_parent[c] = 1;
        }
      }
      while (t <= L) e_level_offsets[t++] = k;
    }
    result = Py_BuildValue("(NNNNNNNNNNNNNNnO)", made[0], made[1], made[2], made[3], made[4],
                           made[5], made[6], made[7], made[8], made[9], made[10], made[11],
                           made[12], made[13], L, is_forest ? Py_True : Py_False);
    goto release;
  fail:
    for (auto *m : made) Py_XDECREF(m);
    result = nullptr;
  }
release:
  for (Py_ssize_t j = 0; j < held; ++j) PyBuffer_Release(&views[j]);
  if (!result && !PyErr_Occurred()) Py_RETURN_NONE;
  return result;
}
"""

_SCHEDULE = ("offsets", "child_ptr", "child_ids", "roots", "sample_of", "level", "order",
             "row_of", "level_offsets", "edge_parent_row", "edge_child_row", "edge_slot",
             "edge_level_offsets", "edge_parent_local")
_GRAPH_ARRAYS = ("child_ptr", "child_ids", "_level", "roots")


def batch_schedule(graphs):
    """A batch's schedule from its graphs (a list of InputGraphs with their levels): a dict of
    the :class:`~minicavs.vertex.graphs.GraphBatch` fields it sets (read-only int64 arrays,
    ``num_levels``, ``is_forest``), or None: a graph without levels yet, or no native code."""
    function = _build()[1]
    found = None if function is None else function(graphs, _GRAPH_ARRAYS)
    if found is None:
        return None
    fields = dict(zip(_SCHEDULE, (np.frombuffer(b, np.int64) for b in found[:-2])))
    fields["num_levels"], fields["is_forest"] = found[-2:]
    return fields


def ordered_child_lists(children):
    """``(child_ptr, child_ids, level, roots, num_children)``, read-only int64 arrays, of
    ``children`` in the common form (see the module docstring), or None: another form, or no
    native code here."""
    function = _build()[0]
    found = None if function is None else function(children)
    return None if found is None else tuple(np.frombuffer(b, np.int64) for b in found)


def unavailable():
    """Why graphs are made in Python only here (``python -m minicavs doctor``), or None."""
    return _build()[2]


@functools.lru_cache(maxsize=None)
def _build():
    # What a job loads next compiles beside: a CPU job's kernels, a GPU job's C issuer.
    if backend.get_device() == "cpu":
        from ..cpu import kernels

        kernels.compile_ahead()
    else:
        from ..cuda import issuer, kernels

        try:
            ahead = issuer.enabled()
        except ArgumentError:  # (a bad MINICAVS_CUDA_ISSUER: the issuer's first use says so)
            ahead = False
        if ahead:
            build.compile_ahead(issuer.SOURCE, "cuda_issuer", "minicavs/cuda/issuer.py")
        kernels.compile_ahead()  # (the row moves, the loss, the optimiser: NVRTC, side by side)
    lib, reason = build.python_module(_SOURCE, "graphs", "minicavs/vertex/native.py")
    if lib is None:  # (the Python path makes every graph: only slower)
        return None, None, reason
    lists, schedule = lib.minicavs_ordered_child_lists, lib.minicavs_batch_schedule
    lists.restype = schedule.restype = ctypes.py_object
    lists.argtypes, schedule.argtypes = [ctypes.py_object], [ctypes.py_object] * 2
    return lists, schedule, None
