"""The recorder's hot path in C: ``AutoBatch.record_known`` and ``_view`` as one CPython call.

Recording is the only per-node Python work of an autobatched step, and at about a microsecond a
node or view it was a quarter to a third of a mini-batch (the char tagger records 31,000 nodes
and views a step). This is the same code — ``scope.py`` is the reference, and the tests run
every model both ways — written against CPython's C API: the key of a call's form built as
the same tuple, the same dict of known forms, the node's slots written by offset. A form met
again in the scope is found by its words (the op, the grad mode and its operands' identities,
no tuple built), a view's form by its op, base and columns or shape; a node's index and depth
are one int each: a tiny tagger's recording 112.8 -> 99.0 M instructions, the char tagger's
116.6 -> 102.1 M (callgrind). Anything the fast path does not answer (a form seen for the first time, promotion, tracing)
goes back to the Python methods, as before.

It is compiled like the native kernels (``cpu/build.py``: cached on disk, checked before it
is loaded), with the interpreter's headers; where that is not possible — native code off, no
compiler, no headers — :func:`recorder` returns None and the scope records in Python.
"""

import ctypes
import functools
import itertools

import numpy as np

from .. import backend
from ..autodiff.tensor import Tensor, is_grad_enabled
from ..cpu import build, kernels
from ..errors import MinicavsError
from ..ops import registry
from ..ops.shape import RESHAPE, SLICE_AXIS
from . import views
from .signature import Signature

_SOURCE = r"""// minicavs autobatch recorder (minicavs/autobatch/native.py); see scope.py for the
// reference in Python: record_known, _view, _append, _leaf, _data_leaf.
#include <Python.h>
#include <structmember.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace {

// Slot offsets, read from the types' member descriptors.
struct Offsets {
  Py_ssize_t scope, index, depth, aval, value, versions, creator, grad, name, requires_grad,
      base, key;                                  // LazyTensor / LazyView
  Py_ssize_t key_tag, key_start, key_shape, key_aval;  // ViewKey
  Py_ssize_t sig_nodes, sig_rows, sig_local, sig_out, sig_can_grad;  // Signature
};

inline PyObject *&slot(PyObject *o, Py_ssize_t offset) {
  return *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(o) + offset);
}

inline void put(PyObject *o, Py_ssize_t offset, PyObject *value) {  // steals value
  PyObject *old = slot(o, offset);
  slot(o, offset) = value;
  Py_XDECREF(old);
}

// A call form as words: the op, the grad mode, then per operand a tag and what identifies it
// (a lazy value's aval, a parameter, a data operand's dtype code and shape), then per integer
// attribute its name and value — what the key tuple of scope.record_known holds, by identity.
// Forms with other attributes (a shape, a float) are not cached.
constexpr int kFormWords = 32, kFormSlots = 128, kFormProbes = 4;
constexpr uintptr_t kViewMark = 9;  // words[1] of a view's form (a call's: a grad mode object)
// A data operand's dtype, its .str (held: the forms' words name a dtype by this object) and
// whether it is an integer dtype (a 0-d integer array is a label or an id: data; a 0-d float
// one a constant).
constexpr int kDataTypes = 8;
struct DataType {
  PyObject *dtype, *code;
  bool index;
};

struct FormSlot {
  Py_ssize_t n;  // words (0: empty)
  uintptr_t words[kFormWords];
  PyObject *known;  // a call's (Signature, avals) of scope._known, a view's ViewKey (owned)
};

struct Recorder {
  PyObject_HEAD
  PyObject *scope, *state;      // the AutoBatch and its __dict__ (start, count, lists)
  PyObject *known;              // scope._known
  PyTypeObject *lazy, *view, *tensor, *ndarray;
  PyObject *tracing;            // registry.tracers() of its thread (nonempty while tracing)
  // This thread's grad mode (True or False), a call form's part: set when the recorder is
  // made and by the scope when it changes (scope.grad_mode_changed); read from autodiff's
  // thread-local it cost ~350 instructions a call, a tenth of the fast path.
  PyObject *grad_enabled;
  PyObject *slice_op, *reshape_op;
  PyObject *views_by_id;        // views._BY_ID
  PyObject *view_key;           // views.view_key (a form not seen yet)
  PyObject *learn;              // scope._learn (a call form not seen yet)
  // The dtypes of the data operands met (a word id, a label, a Tensor of data: thousands a
  // step, of a few dtypes), each with its .str and whether it is an integer one, read once,
  // not per call. Held, so their codes name them in the forms' words (DataType).
  DataType dtypes[kDataTypes];
  int num_dtypes;
  Py_ssize_t dtypes_forgotten;  // (counted: a call that saw it happen does not keep its form)
  PyObject *no_axes;
  // The attribute names met (each its own key): a call's integer attributes are part of its
  // form as (this name object, value) words, so a name met by another object is still one
  // word, and the object a word points at lives as long as the recorder.
  PyObject *attr_names;
  Offsets at;
  // The call forms met in this scope, by their words (record_known), each with the entry of
  // scope._known it found: a form met again costs no key tuple, no ints and no dict lookup.
  FormSlot forms[kFormSlots];
};

PyObject *s_start, *s_count, *s_node_depth, *s_active, *s_leaves, *s_leaf_ids, *s_views,
    *s_shape, *s_dtype, *s_ndim, *s_kind, *s_str, *s_axis, *s_stop, *s_copy,
    *s_array;

Py_ssize_t scope_int(Recorder *r, PyObject *name) {
  PyObject *v = PyDict_GetItem(r->state, name);
  return v ? PyLong_AsSsize_t(v) : -1;
}

PyObject *scope_obj(Recorder *r, PyObject *name) {  // borrowed
  PyObject *v = PyDict_GetItem(r->state, name);
  if (!v) PyErr_Format(PyExc_RuntimeError, "autobatch recorder: the scope has no %U", name);
  return v;
}

int set_scope_int(Recorder *r, PyObject *name, Py_ssize_t value) {
  PyObject *v = PyLong_FromSsize_t(value);
  if (!v) return -1;
  int rc = PyDict_SetItem(r->state, name, v);
  Py_DECREF(v);
  return rc;
}

int append_int(PyObject *list, Py_ssize_t value) {
  PyObject *v = PyLong_FromSsize_t(value);
  if (!v) return -1;
  int rc = PyList_Append(list, v);
  Py_DECREF(v);
  return rc;
}

// _leaf: the leaf number of a value read as data (-1 - j), made on first sight.
Py_ssize_t leaf(Recorder *r, PyObject *value) {
  PyObject *ids = scope_obj(r, s_leaf_ids), *leaves = scope_obj(r, s_leaves);
  if (!ids || !leaves) return PY_SSIZE_T_MIN;
  PyObject *id = PyLong_FromVoidPtr(value);
  if (!id) return PY_SSIZE_T_MIN;
  PyObject *j = PyDict_GetItemWithError(ids, id);
  Py_ssize_t result;
  if (j) {
    result = PyLong_AsSsize_t(j);
  } else if (PyErr_Occurred()) {
    result = PY_SSIZE_T_MIN;
  } else {
    result = PyList_GET_SIZE(leaves);
    PyObject *n = PyLong_FromSsize_t(result);
    if (!n || PyDict_SetItem(ids, id, n) < 0 || PyList_Append(leaves, value) < 0)
      result = PY_SSIZE_T_MIN;
    Py_XDECREF(n);
  }
  Py_DECREF(id);
  return result == PY_SSIZE_T_MIN ? result : -1 - result;
}

// _data_leaf: data (an array, a Tensor needing no gradient) copied as it is recorded.
Py_ssize_t data_leaf(Recorder *r, PyObject *value) {
  PyObject *leaves = scope_obj(r, s_leaves);
  if (!leaves) return PY_SSIZE_T_MIN;
  PyObject *array = Py_TYPE(value) == r->ndarray ? (Py_INCREF(value), value)
                                                 : PyObject_GetAttr(value, s_array);
  PyObject *copy = array ? PyObject_CallMethodNoArgs(array, s_copy) : nullptr;
  Py_XDECREF(array);
  if (!copy) return PY_SSIZE_T_MIN;
  int rc = PyList_Append(leaves, copy);
  Py_DECREF(copy);
  return rc < 0 ? PY_SSIZE_T_MIN : -PyList_GET_SIZE(leaves);
}

// A lazy value (or view) of ``type``: index ``i`` and depth ``d`` (ints, references given to
// it) and the rest of its slots.
PyObject *fresh(Recorder *r, PyTypeObject *type, PyObject *aval, PyObject *i, PyObject *d,
                bool requires_grad) {
  PyObject *node = type->tp_alloc(type, 0);
  if (!node) {
    Py_DECREF(i);
    Py_DECREF(d);
    return nullptr;
  }
  const Offsets &at = r->at;
  Py_INCREF(r->scope);
  put(node, at.scope, r->scope);
  put(node, at.index, i);
  put(node, at.depth, d);
  Py_INCREF(aval);
  put(node, at.aval, aval);
  for (Py_ssize_t o : {at.value, at.versions, at.creator, at.grad, at.name}) {
    Py_INCREF(Py_None);
    put(node, o, Py_None);
  }
  PyObject *flag = requires_grad ? Py_True : Py_False;
  Py_INCREF(flag);
  put(node, at.requires_grad, flag);
  return node;
}

// _append: record one node of signature sig.
PyObject *append(Recorder *r, PyObject *sig, const Py_ssize_t *sources, Py_ssize_t n,
                 Py_ssize_t depth, bool needs_grad) {
  const Offsets &at = r->at;
  Py_ssize_t index = scope_int(r, s_count);
  if (index < 0 || set_scope_int(r, s_count, index + 1) < 0) return nullptr;
  PyObject *nodes = slot(sig, at.sig_nodes), *rows = slot(sig, at.sig_rows);
  PyObject *depths = scope_obj(r, s_node_depth);
  if (!nodes || !rows || !depths || !PyList_Check(nodes) || !PyList_Check(rows)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "autobatch recorder: bad signature");
    return nullptr;
  }
  if (PyList_GET_SIZE(nodes) == 0) {  // its first node in this segment
    PyObject *active = scope_obj(r, s_active);
    if (!active) return nullptr;
    PyObject *local = PyLong_FromSsize_t(PyList_GET_SIZE(active));
    if (!local) return nullptr;
    put(sig, at.sig_local, local);
    if (PyList_Append(active, sig) < 0) return nullptr;
  }
  for (Py_ssize_t k = 0; k < n; ++k)
    if (append_int(rows, sources[k]) < 0) return nullptr;
  // (one int object each for the index and the depth: the lists' and the node's)
  PyObject *i = PyLong_FromSsize_t(index), *d = PyLong_FromSsize_t(depth + 1);
  if (!i || !d || PyList_Append(nodes, i) < 0 || PyList_Append(depths, d) < 0) {
    Py_XDECREF(i);
    Py_XDECREF(d);
    return nullptr;
  }
  return fresh(r, r->lazy, slot(sig, at.sig_out), i, d,
               needs_grad && slot(sig, at.sig_can_grad) == Py_True);
}

// The slot of a form's words: where they are, else where they go (an empty slot, else the
// first one looked at), among kFormProbes slots from their hash (FNV-1a). *met: found there.
FormSlot &form_slot(Recorder *r, const uintptr_t *words, Py_ssize_t n, bool *met) {
  uint64_t h = 1469598103934665603ull;
  for (Py_ssize_t k = 0; k < n; ++k) h = (h ^ words[k]) * 1099511628211ull;
  const uint64_t first = (h ^ (h >> 29)) % kFormSlots;
  FormSlot *empty = nullptr;
  for (int probe = 0; probe < kFormProbes; ++probe) {
    FormSlot &f = r->forms[(first + probe) % kFormSlots];
    if (f.n == n && std::memcmp(f.words, words, n * sizeof(uintptr_t)) == 0) {
      *met = true;
      return f;
    }
    if (!f.n && !empty) empty = &f;
  }
  *met = false;
  return empty ? *empty : r->forms[first];
}

// Keep ``known`` (a reference taken here) as what the form of ``words`` finds in ``f``.
void remember(FormSlot *f, const uintptr_t *words, Py_ssize_t n, PyObject *known) {
  Py_INCREF(known);
  Py_XSETREF(f->known, known);
  std::memcpy(f->words, words, n * sizeof(uintptr_t));
  f->n = n;
}

PyObject *view_of_form(Recorder *r, PyObject *base, PyObject *base_aval, PyObject *form,
                       FormSlot *slot_for, const uintptr_t *words, Py_ssize_t nwords);
PyObject *fresh_view(Recorder *r, PyObject *base, PyObject *key);

// _view: a slice of the last axis, or a reshape, of a pending node as a LazyView; None where
// it is not one (recorded as a node).
PyObject *make_view(Recorder *r, PyObject *op, PyObject *x, PyObject *attrs) {
  const Offsets &at = r->at;
  PyTypeObject *type = Py_TYPE(x);
  PyObject *base = type == r->view ? slot(x, at.base) : x;
  if (!base || Py_TYPE(base) != r->lazy || slot(base, at.scope) != r->scope)
    Py_RETURN_NONE;
  Py_ssize_t start = scope_int(r, s_start), index = PyLong_AsSsize_t(slot(base, at.index));
  if (index == -1 && PyErr_Occurred()) return nullptr;
  if (index < start) Py_RETURN_NONE;
  PyObject *base_aval = slot(base, at.aval), *form;
  // The view's form as words (the op, a mark no grad mode's object has, the base's aval, the
  // columns or the shape): its ViewKey found by them once met in this scope.
  uintptr_t words[kFormWords];
  Py_ssize_t nwords = 3;
  words[0] = reinterpret_cast<uintptr_t>(op);
  words[1] = kViewMark;
  words[2] = reinterpret_cast<uintptr_t>(base_aval);
  bool cacheable = true, met = false;
  if (op == r->reshape_op) {
    if (base != x) Py_RETURN_NONE;
    PyObject *shape = PyDict_GetItem(attrs, s_shape);
    if (!shape || !PyTuple_CheckExact(shape)) Py_RETURN_NONE;  // (Python's path converts)
    const Py_ssize_t dims = PyTuple_GET_SIZE(shape);
    cacheable = nwords + 1 + dims <= kFormWords;
    if (cacheable) {
      words[nwords++] = static_cast<uintptr_t>(dims);
      for (Py_ssize_t d = 0; d < dims && cacheable; ++d) {
        const Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (size == -1 && PyErr_Occurred()) { PyErr_Clear(); cacheable = false; }
        words[nwords++] = static_cast<uintptr_t>(size);
      }
    }
    FormSlot *f = cacheable ? &form_slot(r, words, nwords, &met) : nullptr;
    if (met) return fresh_view(r, base, f->known);
    form = Py_BuildValue("(NOOO)", PyLong_FromVoidPtr(base_aval), Py_None, Py_None, shape);
    if (!form) return nullptr;
    return view_of_form(r, base, base_aval, form, f, words, nwords);
  } else {
    PyObject *axis = PyDict_GetItem(attrs, s_axis), *lo = PyDict_GetItem(attrs, s_start),
             *hi = PyDict_GetItem(attrs, s_stop);
    PyObject *x_shape = PyTuple_GET_ITEM(slot(x, at.aval), 0);
    if (!axis || !lo || !hi || !PyLong_Check(axis) || !PyLong_Check(lo) || !PyLong_Check(hi))
      Py_RETURN_NONE;
    if (PyLong_AsSsize_t(axis) != PyTuple_GET_SIZE(x_shape) - 1) Py_RETURN_NONE;
    Py_ssize_t offset = 0;
    if (base != x) {
      PyObject *key = slot(x, at.key);
      if (slot(key, at.key_shape) != Py_None) Py_RETURN_NONE;  // a view of a reshape: a node
      offset = PyLong_AsSsize_t(slot(key, at.key_start));
    }
    const Py_ssize_t first = offset + PyLong_AsSsize_t(lo), stop = offset + PyLong_AsSsize_t(hi);
    words[nwords++] = static_cast<uintptr_t>(first);
    words[nwords++] = static_cast<uintptr_t>(stop);
    FormSlot &f = form_slot(r, words, nwords, &met);
    if (met) return fresh_view(r, base, f.known);
    form = Py_BuildValue("(NnnO)", PyLong_FromVoidPtr(base_aval), first, stop, Py_None);
    if (!form) return nullptr;
    return view_of_form(r, base, base_aval, form, &f, words, nwords);
  }
}

// A view of ``base`` whose form (views._BY_ID's key; the reference is taken here) was not met
// yet in this scope: its ViewKey from views (made there at first sight), kept in ``slot_for``.
PyObject *view_of_form(Recorder *r, PyObject *base, PyObject *base_aval, PyObject *form,
                       FormSlot *slot_for, const uintptr_t *words, Py_ssize_t nwords) {
  PyObject *found = PyDict_GetItemWithError(r->views_by_id, form), *key;
  if (found) {
    key = PyTuple_GET_ITEM(found, 1);
    Py_INCREF(key);
  } else if (PyErr_Occurred()) {
    Py_DECREF(form);
    return nullptr;
  } else {  // first sight of this form: views.view_key makes it
    key = PyObject_CallFunctionObjArgs(r->view_key, base_aval, PyTuple_GET_ITEM(form, 1),
                                       PyTuple_GET_ITEM(form, 2), PyTuple_GET_ITEM(form, 3),
                                       nullptr);
  }
  Py_DECREF(form);
  if (!key) return nullptr;
  if (slot_for) remember(slot_for, words, nwords, key);  // (a ViewKey lives as long as views)
  PyObject *view = fresh_view(r, base, key);
  Py_DECREF(key);
  return view;
}

// The LazyView of ``base`` through ``key`` (a ViewKey, borrowed), counted in scope.views.
PyObject *fresh_view(Recorder *r, PyObject *base, PyObject *key) {
  const Offsets &at = r->at;
  PyObject *i = slot(base, at.index), *d = slot(base, at.depth);  // (the base's own ints)
  Py_INCREF(i);
  Py_INCREF(d);
  PyObject *view = fresh(r, r->view, slot(key, at.key_aval), i, d,
                         slot(base, at.requires_grad) == Py_True);
  if (view) {
    Py_INCREF(base);
    put(view, at.base, base);
    Py_INCREF(key);
    put(view, at.key, key);
    Py_ssize_t views = scope_int(r, s_views);
    if (views < 0 || set_scope_int(r, s_views, views + 1) < 0) Py_CLEAR(view);
  }
  return view;
}

void forget_dtypes(Recorder *r) {
  for (int k = 0; k < r->num_dtypes; ++k) {
    Py_CLEAR(r->dtypes[k].dtype);
    Py_CLEAR(r->dtypes[k].code);
  }
  r->num_dtypes = 0;
}

// A data operand's dtype as met before, or read now: its .str (the key's part, as Python's
// record_known writes it) and kind. Kept while the recorder lives, so two dtypes that take
// turns (a model's labels and its float initial state: four times a sentence) keep their
// forms; a ninth forgets the others, and the forms with them (a code let go may have its
// address reused by another). nullptr on an error.
const DataType *data_type(Recorder *r, PyObject *dtype) {
  for (int k = 0; k < r->num_dtypes; ++k)
    if (r->dtypes[k].dtype == dtype) return &r->dtypes[k];
  PyObject *code = PyObject_GetAttr(dtype, s_str), *kind = PyObject_GetAttr(dtype, s_kind);
  if (!code || !kind) {
    Py_XDECREF(code);
    Py_XDECREF(kind);
    return nullptr;
  }
  const bool index = PyUnicode_CompareWithASCIIString(kind, "i") == 0 ||
                     PyUnicode_CompareWithASCIIString(kind, "u") == 0;
  Py_DECREF(kind);
  if (r->num_dtypes == kDataTypes) {
    forget_dtypes(r);
    ++r->dtypes_forgotten;
    for (FormSlot &f : r->forms) {
      Py_CLEAR(f.known);
      f.n = 0;
    }
  }
  DataType &t = r->dtypes[r->num_dtypes++];
  Py_INCREF(dtype);
  t.dtype = dtype;
  t.code = code;
  t.index = index;
  return &t;
}

// The recorder's own object for attribute ``name`` (borrowed), or nullptr with an error.
PyObject *attr_name(Recorder *r, PyObject *name) {
  PyObject *held = PyDict_GetItemWithError(r->attr_names, name);
  if (held || PyErr_Occurred()) return held;
  return PyDict_SetItem(r->attr_names, name, name) < 0 ? nullptr : name;
}

PyObject *record_known(Recorder *r, PyObject *op, PyObject *args, PyObject *attrs) {
  if (PyList_GET_SIZE(r->tracing)) Py_RETURN_NONE;
  if ((op == r->slice_op || op == r->reshape_op) && PyTuple_GET_SIZE(args) >= 1) {
    PyObject *view = make_view(r, op, PyTuple_GET_ITEM(args, 0), attrs);
    if (view != Py_None) return view;  // a view, or an error
    Py_DECREF(view);
  }
  const Offsets &at = r->at;
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (nargs > 60) Py_RETURN_NONE;
  Py_ssize_t start = scope_int(r, s_start);
  if (start == -1 && PyErr_Occurred()) return nullptr;
  // Each operand's source row and its part of the form: the words, and for the key tuple of a
  // form not met yet a data operand's shape (kept: new references, released at the end).
  Py_ssize_t sources[64], n = 0, depth = 0, nwords = 2;
  uintptr_t words[kFormWords];
  words[0] = reinterpret_cast<uintptr_t>(op);
  words[1] = reinterpret_cast<uintptr_t>(r->grad_enabled);
  PyObject *shapes[64] = {nullptr}, *codes[64] = {nullptr};  // (new references)
  const Py_ssize_t dtypes_forgotten = r->dtypes_forgotten;
  bool needs_grad = false, cacheable = true;
  auto word = [&](uintptr_t w) {
    if (nwords < kFormWords) words[nwords] = w;
    ++nwords;
  };
  // Integer attributes (concat's axis) as words; any other (a shape, a float) keeps the form
  // out of the slots: its key tuple is looked up each call.
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (PyDict_Next(attrs, &pos, &name, &value)) {
    if (!PyUnicode_CheckExact(name) || !PyLong_CheckExact(value)) {
      cacheable = false;
      break;
    }
    const Py_ssize_t v = PyLong_AsSsize_t(value);
    PyObject *held = v == -1 && PyErr_Occurred() ? nullptr : attr_name(r, name);
    if (!held) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return nullptr;
      PyErr_Clear();
      cacheable = false;
      break;
    }
    word(4);
    word(reinterpret_cast<uintptr_t>(held));
    word(static_cast<uintptr_t>(v));
  }
  auto release = [&]() {
    for (Py_ssize_t k = 0; k < nargs; ++k) {
      Py_XDECREF(shapes[k]);
      Py_XDECREF(codes[k]);
    }
  };
  for (Py_ssize_t k = 0; k < nargs; ++k) {
    PyObject *a = PyTuple_GET_ITEM(args, k);
    PyTypeObject *type = Py_TYPE(a);
    if (type == r->lazy || type == r->view) {
      word(1);
      word(reinterpret_cast<uintptr_t>(slot(a, at.aval)));
      Py_ssize_t i = PyLong_AsSsize_t(slot(a, at.index));
      if (i >= start && slot(a, at.scope) == r->scope) {
        sources[n++] = type == r->lazy ? i : i + PyLong_AsSsize_t(slot(slot(a, at.key), at.key_tag));
        Py_ssize_t d = PyLong_AsSsize_t(slot(a, at.depth));
        if (d > depth) depth = d;
      } else {
        Py_ssize_t j = leaf(r, a);
        if (j == PY_SSIZE_T_MIN) { release(); return nullptr; }
        sources[n++] = j;
      }
      if (slot(a, at.requires_grad) == Py_True) needs_grad = true;
    } else if (PyObject_TypeCheck(a, r->tensor) && slot(a, at.requires_grad) == Py_True) {
      word(2);
      word(reinterpret_cast<uintptr_t>(a));  // a parameter, by identity
      needs_grad = true;
    } else if (type == r->ndarray || type == r->tensor) {
      PyObject *dtype = PyObject_GetAttr(a, s_dtype);
      if (!dtype) { release(); return nullptr; }
      const DataType *data = data_type(r, dtype);
      Py_DECREF(dtype);  // (dtypes holds it)
      if (!data) { release(); return nullptr; }
      PyObject *ndim = PyObject_GetAttr(a, s_ndim);
      if (!ndim) { release(); return nullptr; }
      const int dims = PyObject_IsTrue(ndim);
      Py_DECREF(ndim);
      if (dims < 0) { release(); return nullptr; }
      if (!dims && !(type == r->ndarray && data->index)) {  // a scalar constant: Python's path
        release();
        Py_RETURN_NONE;
      }
      PyObject *shape = dims ? PyObject_GetAttr(a, s_shape) : (Py_INCREF(r->no_axes), r->no_axes);
      if (!shape) { release(); return nullptr; }
      shapes[k] = shape;
      // (the code object stands for its dtype's .str: held in dtypes, no other dtype's code
      // has its address)
      word(3);
      word(reinterpret_cast<uintptr_t>(data->code));
      Py_INCREF(data->code);
      codes[k] = data->code;
      if (!PyTuple_CheckExact(shape)) {
        cacheable = false;
      } else {
        word(static_cast<uintptr_t>(PyTuple_GET_SIZE(shape)));
        for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d) {
          const Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
          if (size == -1 && PyErr_Occurred()) { PyErr_Clear(); cacheable = false; }
          word(static_cast<uintptr_t>(size));
        }
      }
      Py_ssize_t j = data_leaf(r, a);
      if (j == PY_SSIZE_T_MIN) { release(); return nullptr; }
      sources[n++] = j;
    } else {
      release();
      Py_RETURN_NONE;
    }
  }
  if (n == 0) { release(); Py_RETURN_NONE; }
  cacheable = cacheable && nwords <= kFormWords && r->dtypes_forgotten == dtypes_forgotten;
  bool met = false;
  FormSlot *form = cacheable ? &form_slot(r, words, nwords, &met) : nullptr;
  if (met) {
    release();
    return append(r, PyTuple_GET_ITEM(form->known, 0), sources, n, depth, needs_grad);
  }
  // The key tuple of scope.record_known: the op, the grad mode, per operand its part, then
  // the attributes' items.
  const bool has_attrs = PyDict_GET_SIZE(attrs) > 0;
  PyObject *key = PyTuple_New(2 + nargs + (has_attrs ? 1 : 0));
  if (!key) { release(); return nullptr; }
  Py_INCREF(op);
  PyTuple_SET_ITEM(key, 0, op);
  Py_INCREF(r->grad_enabled);
  PyTuple_SET_ITEM(key, 1, r->grad_enabled);
  for (Py_ssize_t k = 0; k < nargs; ++k) {
    PyObject *a = PyTuple_GET_ITEM(args, k), *part;
    PyTypeObject *type = Py_TYPE(a);
    if (type == r->lazy || type == r->view)
      part = PyLong_FromVoidPtr(slot(a, at.aval));
    else if (shapes[k])
      part = PyTuple_Pack(2, shapes[k], codes[k]);
    else
      part = PyLong_FromVoidPtr(a);  // a parameter, by identity
    if (!part) { Py_DECREF(key); release(); return nullptr; }
    PyTuple_SET_ITEM(key, 2 + k, part);
  }
  release();
  if (has_attrs) {
    PyObject *items = PyDict_Items(attrs), *part = items ? PyList_AsTuple(items) : nullptr;
    Py_XDECREF(items);
    if (!part) { Py_DECREF(key); return nullptr; }
    PyTuple_SET_ITEM(key, 2 + nargs, part);
  }
  PyObject *known = PyDict_GetItemWithError(r->known, key);
  if (!known) {
    if (PyErr_Occurred()) {  // an unhashable attribute: Python's path
      Py_DECREF(key);
      if (!PyErr_ExceptionMatches(PyExc_TypeError)) return nullptr;
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    PyObject *node = PyObject_CallFunctionObjArgs(r->learn, key, op, args, attrs, nullptr);
    Py_DECREF(key);
    return node;
  }
  Py_DECREF(key);
  if (form) remember(form, words, nwords, known);  // (known from now on by its words)
  return append(r, PyTuple_GET_ITEM(known, 0), sources, n, depth, needs_grad);
}

PyObject *recorder_call(PyObject *self, PyObject *args, PyObject *kwargs) {
  PyObject *op, *operands, *attrs;
  if (kwargs || !PyArg_UnpackTuple(args, "record_known", 3, 3, &op, &operands, &attrs))
    return nullptr;
  if (!PyTuple_Check(operands) || !PyDict_Check(attrs)) Py_RETURN_NONE;
  return record_known(reinterpret_cast<Recorder *>(self), op, operands, attrs);
}

void recorder_dealloc(PyObject *self) {
  Recorder *r = reinterpret_cast<Recorder *>(self);
  PyObject_GC_UnTrack(self);
  for (PyObject **p : {&r->scope, &r->state, &r->known, &r->tracing, &r->grad_enabled,
                       &r->slice_op, &r->reshape_op, &r->views_by_id, &r->view_key, &r->learn,
                       &r->no_axes, &r->attr_names})
    Py_CLEAR(*p);
  forget_dtypes(r);
  for (FormSlot &f : r->forms) Py_CLEAR(f.known);
  Py_CLEAR(r->lazy);
  Py_CLEAR(r->view);
  Py_CLEAR(r->tensor);
  Py_CLEAR(r->ndarray);
  PyTypeObject *type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

int recorder_traverse(PyObject *self, visitproc visit, void *arg) {
  Recorder *r = reinterpret_cast<Recorder *>(self);
  Py_VISIT(r->scope);
  Py_VISIT(r->state);
  Py_VISIT(r->known);
  Py_VISIT(r->learn);
  for (FormSlot &f : r->forms) Py_VISIT(f.known);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

int recorder_clear(PyObject *self) {
  Recorder *r = reinterpret_cast<Recorder *>(self);
  Py_CLEAR(r->scope);
  Py_CLEAR(r->state);
  Py_CLEAR(r->known);
  Py_CLEAR(r->learn);
  for (FormSlot &f : r->forms) {
    Py_CLEAR(f.known);
    f.n = 0;
  }
  return 0;
}

PyMemberDef recorder_members[] = {
    {"grad_enabled", T_OBJECT_EX, offsetof(Recorder, grad_enabled), 0,
     "This thread's grad mode, as the recorded calls are keyed by it"},
    {nullptr, 0, 0, 0, nullptr}};

PyTypeObject *recorder_type = nullptr;

Py_ssize_t offset_of(PyObject *type, const char *name) {
  PyObject *descr = PyObject_GetAttrString(type, name);
  if (!descr) return -1;
  Py_ssize_t offset = -1;
  if (Py_TYPE(descr) == &PyMemberDescr_Type) {
    PyMemberDef *member = reinterpret_cast<PyMemberDescrObject *>(descr)->d_member;
    if (member->type == T_OBJECT_EX) offset = member->offset;
  }
  Py_DECREF(descr);
  if (offset < 0 && !PyErr_Occurred())
    PyErr_Format(PyExc_TypeError, "autobatch recorder: %s is not a slot", name);
  return offset;
}

}  // namespace

extern "C" PyObject *make_recorder(PyObject *scope, PyObject *types, PyObject *tracing,
                                   PyObject *grad_enabled, PyObject *ops, PyObject *views) {
  // types: (LazyTensor, LazyView, Tensor, ndarray, ViewKey, Signature); ops: (SLICE_AXIS,
  // RESHAPE); views: (views._BY_ID, views.view_key)
  if (!recorder_type) {
    static PyType_Slot slots[] = {
        {Py_tp_call, reinterpret_cast<void *>(recorder_call)},
        {Py_tp_members, reinterpret_cast<void *>(recorder_members)},
        {Py_tp_dealloc, reinterpret_cast<void *>(recorder_dealloc)},
        {Py_tp_traverse, reinterpret_cast<void *>(recorder_traverse)},
        {Py_tp_clear, reinterpret_cast<void *>(recorder_clear)},
        {0, nullptr}};
    static PyType_Spec spec = {"minicavs.autobatch.native.Recorder", sizeof(Recorder), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, slots};
    recorder_type = reinterpret_cast<PyTypeObject *>(PyType_FromSpec(&spec));
    if (!recorder_type) return nullptr;
    s_start = PyUnicode_InternFromString("start");
    s_count = PyUnicode_InternFromString("count");
    s_node_depth = PyUnicode_InternFromString("node_depth");
    s_active = PyUnicode_InternFromString("active");
    s_leaves = PyUnicode_InternFromString("leaves");
    s_leaf_ids = PyUnicode_InternFromString("_leaf_ids");
    s_views = PyUnicode_InternFromString("views");
    s_shape = PyUnicode_InternFromString("shape");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_ndim = PyUnicode_InternFromString("ndim");
    s_kind = PyUnicode_InternFromString("kind");
    s_str = PyUnicode_InternFromString("str");
    s_axis = PyUnicode_InternFromString("axis");
    s_stop = PyUnicode_InternFromString("stop");
    s_copy = PyUnicode_InternFromString("copy");
    s_array = PyUnicode_InternFromString("_array");
  }
  PyObject *lazy = PyTuple_GET_ITEM(types, 0), *view = PyTuple_GET_ITEM(types, 1),
           *view_key_type = PyTuple_GET_ITEM(types, 4), *sig = PyTuple_GET_ITEM(types, 5);
  Offsets at;
  struct { Py_ssize_t *out; PyObject *type; const char *name; } fields[] = {
      {&at.scope, lazy, "_scope"}, {&at.index, lazy, "_index"}, {&at.depth, lazy, "_depth"},
      {&at.aval, lazy, "_aval"}, {&at.value, lazy, "_value"},
      {&at.versions, lazy, "_versions"}, {&at.creator, lazy, "_creator"},
      {&at.grad, lazy, "grad"}, {&at.name, lazy, "name"},
      {&at.requires_grad, lazy, "requires_grad"}, {&at.base, view, "_base"},
      {&at.key, view, "_key"}, {&at.key_tag, view_key_type, "tag"},
      {&at.key_start, view_key_type, "start"}, {&at.key_shape, view_key_type, "shape"},
      {&at.key_aval, view_key_type, "aval"}, {&at.sig_nodes, sig, "nodes"},
      {&at.sig_rows, sig, "arg_rows"}, {&at.sig_local, sig, "local"},
      {&at.sig_out, sig, "out"}, {&at.sig_can_grad, sig, "can_grad"}};
  for (auto &f : fields)
    if ((*f.out = offset_of(f.type, f.name)) < 0) return nullptr;
  PyObject *state = PyObject_GenericGetDict(scope, nullptr);
  if (!state) return nullptr;
  PyObject *known = PyDict_GetItemString(state, "_known");
  PyObject *learn = PyObject_GetAttrString(scope, "_learn");
  if (!known || !learn) {
    Py_DECREF(state);
    Py_XDECREF(learn);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "autobatch recorder: no _known");
    return nullptr;
  }
  Recorder *r = PyObject_GC_New(Recorder, recorder_type);
  if (!r) { Py_DECREF(state); Py_DECREF(learn); return nullptr; }
  Py_INCREF(scope); r->scope = scope;
  r->state = state;
  Py_INCREF(known); r->known = known;
  r->learn = learn;
  PyTypeObject **type_fields[] = {&r->lazy, &r->view, &r->tensor, &r->ndarray};
  for (int k = 0; k < 4; ++k) {
    PyObject *t = PyTuple_GET_ITEM(types, k);
    Py_INCREF(t);
    *type_fields[k] = reinterpret_cast<PyTypeObject *>(t);
  }
  Py_INCREF(tracing); r->tracing = tracing;
  r->grad_enabled = PyObject_IsTrue(grad_enabled) ? Py_True : Py_False;
  Py_INCREF(r->grad_enabled);
  r->slice_op = PyTuple_GET_ITEM(ops, 0); Py_INCREF(r->slice_op);
  r->reshape_op = PyTuple_GET_ITEM(ops, 1); Py_INCREF(r->reshape_op);
  r->views_by_id = PyTuple_GET_ITEM(views, 0); Py_INCREF(r->views_by_id);
  r->view_key = PyTuple_GET_ITEM(views, 1); Py_INCREF(r->view_key);
  r->num_dtypes = 0;
  r->dtypes_forgotten = 0;
  r->no_axes = PyTuple_New(0);
  r->attr_names = PyDict_New();
  r->at = at;
  for (FormSlot &f : r->forms) {
    f.n = 0;
    f.known = nullptr;
  }
  if (!r->no_axes || !r->attr_names) {
    Py_DECREF(reinterpret_cast<PyObject *>(r));
    return nullptr;
  }
  PyObject_GC_Track(reinterpret_cast<PyObject *>(r));
  return reinterpret_cast<PyObject *>(r);
}

// The ints of a sequence of lists (the signatures' recorded nodes or operand rows), one after
// another, as the bytes of an int64 array: what a segment reads as arrays, without NumPy's
// iterator protocol per int. None where an item is not a list of ints.
extern "C" PyObject *int64_lists(PyObject *lists) {
  PyObject *seq = PySequence_Fast(lists, "int64_lists: a sequence of lists");
  if (!seq) return nullptr;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  Py_ssize_t total = 0;
  for (Py_ssize_t k = 0; k < count; ++k) {
    if (!PyList_Check(items[k])) { Py_DECREF(seq); Py_RETURN_NONE; }
    total += PyList_GET_SIZE(items[k]);
  }
  PyObject *out = PyBytes_FromStringAndSize(nullptr, total * (Py_ssize_t)sizeof(int64_t));
  if (!out) { Py_DECREF(seq); return nullptr; }
  int64_t *at = reinterpret_cast<int64_t *>(PyBytes_AS_STRING(out));
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject *list = items[k];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
      PyObject *v = PyList_GET_ITEM(list, i);
      if (!PyLong_CheckExact(v)) { Py_DECREF(out); Py_DECREF(seq); Py_RETURN_NONE; }
      const long long x = PyLong_AsLongLong(v);
      if (x == -1 && PyErr_Occurred()) { Py_DECREF(out); Py_DECREF(seq); return nullptr; }
      *at++ = x;
    }
  }
  Py_DECREF(seq);
  return out;
}
"""


@functools.lru_cache(maxsize=None)
def _library():
    """The compiled recorder (a ``ctypes.PyDLL``: its calls hold the GIL; ``make_recorder``,
    ``int64_lists``), or None where it cannot be built here (:func:`unavailable` says why)."""
    return _build()[0]


def unavailable():
    """Why the C recorder is not used here (``python -m minicavs doctor`` shows it), or None."""
    return _build()[1]


@functools.lru_cache(maxsize=None)
def _build():
    if backend.get_device() == "cpu":  # (the kernels a CPU block loads next compile beside)
        kernels.compile_ahead()
    else:
        from ..cuda import kernels as cuda_kernels

        cuda_kernels.compile_ahead()
    lib, reason = build.python_module(_SOURCE, "recorder", "minicavs/autobatch/native.py")
    if lib is None:  # (the Python recorder runs; the doctor says why)
        return None, reason
    lib.make_recorder.restype = ctypes.py_object
    lib.make_recorder.argtypes = [ctypes.py_object] * 6
    lib.int64_lists.restype = ctypes.py_object
    lib.int64_lists.argtypes = [ctypes.py_object]
    return lib, None


def int64s(lists, count=-1):
    """The ints of ``lists`` (lists of Python ints), one after another, as an int64 array (read
    only): in C where the recorder is built, else NumPy's ``fromiter``."""
    lib = _library()
    found = lib.int64_lists(lists) if lib is not None else None
    if found is not None:
        return np.frombuffer(found, dtype=np.int64)
    return np.fromiter(itertools.chain.from_iterable(lists), np.int64, count)


# The slots of a lazy value the C code writes (``fresh``, ``make_view``), checked against the
# classes (``_check_slots``): one added to Tensor or LazyTensor and not written there would be
# left NULL, so a slot change must be made in both places, and the check says so.
_WRITTEN = {"_scope", "_index", "_depth", "_aval", "_value", "_versions", "_creator", "grad",
            "name", "requires_grad"}
_WRITTEN_BY_VIEW = _WRITTEN | {"_base", "_key"}


@functools.lru_cache(maxsize=None)
def _check_slots(lazy, view):
    for cls, written in ((lazy, _WRITTEN), (view, _WRITTEN_BY_VIEW)):
        # (``_array``: a lazy value's is a property, the slot it shadows is never read)
        slots = {s for k in cls.__mro__ for s in getattr(k, "__slots__", ())}
        missing = slots - written - {"__weakref__", "_array"}
        if missing:
            raise MinicavsError(f"autobatch/native.py: the C recorder does not write slot(s) "
                                f"{sorted(missing)} of {cls.__name__}; write them in fresh() "
                                f"or make_view() and add them to _WRITTEN")


def recorder(scope, lazy_types):
    """The C fast path for ``scope`` (an ``AutoBatch``) whose values are of ``lazy_types``
    (``LazyTensor``, ``LazyView``), or None (record in Python)."""
    lib = _library()
    if lib is None:
        return None
    _check_slots(*lazy_types)
    types = (*lazy_types, Tensor, np.ndarray, views.ViewKey, Signature)
    return lib.make_recorder(scope, types, registry.tracers(), is_grad_enabled(),
                             (SLICE_AXIS, RESHAPE), (views._BY_ID, views.view_key))
