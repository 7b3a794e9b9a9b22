"""The C recorder (``minicavs/autobatch/native.py``) against its reference, the Python recorder
of ``scope.py``: the same recording, call for call. (``test_autobatch.py`` runs every
autobatch test under each recorder; this compares what they record.)"""

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minicavs as mc
from test_autobatch import D, _combine, _params, _tiny_tagger, _tiny_tree_lstm, _unary

native = sys.modules["minicavs.autobatch.native"]
pytestmark = pytest.mark.skipif(native._library() is None,
                                reason=f"the C recorder cannot be built here: "
                                       f"{native.unavailable()}")


def _recording(c_recorder, program):
    make = native.recorder
    if not c_recorder:
        native.recorder = lambda scope, types: None
    try:
        with mc.autobatch("agenda+") as ab:
            program()
            got = (ab.count, list(ab.node_depth), ab.views, len(ab.leaves),
                   sorted((s.label, list(s.nodes), list(s.arg_rows), s.local)
                          for s in ab.active))
            used = type(ab._fast_path).__name__
            ab.run_pending()
    finally:
        native.recorder = make
    return got, used


def _same_recording(program):
    (c, used), (python, _) = _recording(True, program), _recording(False, program)
    assert used == "Recorder"  # (the C recorder's type)
    assert c == python


@pytest.mark.parametrize("make", [lambda: _tiny_tagger(False), lambda: _tiny_tagger(True),
                                  _tiny_tree_lstm], ids=["tagger", "tagger-char", "tree-lstm"])
def test_the_c_recorder_records_the_plain_models_as_the_python_one(make):
    model, samples, loss_of = make()
    _same_recording(lambda: mc.sum(mc.stack([loss_of(s) for s in samples])))


@settings(max_examples=40, deadline=None)
@given(codes=st.lists(st.integers(0, 40), min_size=1, max_size=12), seed=st.integers(0, 9))
def test_the_c_recorder_records_generated_programs_as_the_python_one(codes, seed):
    """Chains of the generated programs' ops (views, slices of views, reshapes, data ids,
    shared parameters, constants), two samples combined."""
    p = _params(seed)

    def program():
        outs = []
        for sample in range(2):
            h = mc.embedding(p["E"], np.array(sample + 1))
            for code in codes:
                h = _unary(code, h, p)
                if h.shape != (4,):  # (the cells give [h, c] of half the width: back to D)
                    h = mc.concat([h, h])[:4] if h.shape[0] < 4 else h[:4]
            outs.append(h)
        mc.sum(_combine(outs[0], outs[1], p))

    _same_recording(program)


def _signature_labels(program):
    """The labels of the signatures ``program`` records (sorted)."""
    with mc.autobatch("agenda+") as ab:
        program()
        labels = sorted(s.label for s in ab.active)
        ab.run_pending()
    return labels


def test_the_c_recorder_tells_forms_apart_by_their_data_dtypes_and_shapes():
    """The C recorder keeps the call forms it met by words (the op, the grad mode, an aval's,
    a parameter's or a data operand's dtype code and shape): ids of alternating integer dtypes
    and id lists of two lengths, each form met again after the others, are recorded as the
    Python recorder records them, each dtype and length a signature of its own."""
    p = _params(1)
    ids = [np.array(k % 3, dtype=np.int64 if k % 2 else np.int32) for k in range(6)]
    rows = [np.arange(k % 3, k % 3 + (2 if k % 3 else 3)) for k in range(6)]  # (3,) or (2,)

    def program():
        outs = []
        for i, r in zip(ids, rows):
            x = mc.embedding(p["E"], i) + mc.sum(mc.embedding(p["E"], r), axis=0)
            outs.append(mc.tanh(x @ p["W1"]))
        mc.sum(mc.stack(outs))

    _same_recording(program)
    labels = _signature_labels(program)
    assert len([label for label in labels if label.startswith("take_row ")]) == 2  # two dtypes
    assert len([label for label in labels if label.startswith("take_rows ")]) == 2  # two lengths


def test_the_c_recorder_tells_forms_apart_by_their_integer_attributes():
    """Concats along axis 0 and 1 taking turns, the axis also given by an attribute name built
    at run time (another string object of the same name): recorded as the Python recorder records them, one signature per axis, each value the eager
    one."""
    from minicavs.ops.registry import apply
    from minicavs.ops.shape import CONCAT

    p = _params(2)
    name = "".join(["ax", "is"])  # (not the interned literal)
    inputs = [np.random.default_rng(k).standard_normal((2, 2)).astype(np.float32)
              for k in range(4)]

    def program(keep=None):
        outs = []
        for k, a in enumerate(inputs):
            x = mc.tanh(mc.tensor(a) @ p["W1"][:2, :2])
            both = (mc.concat([x, x], axis=k % 2) if k < 2 else
                    apply(CONCAT, x, x, **{name: k % 2}))
            outs.append(mc.sum(both))
            if keep is not None:
                keep.append(both)
        return mc.sum(mc.stack(outs))

    _same_recording(program)
    labels = _signature_labels(program)
    assert len([label for label in labels if label.startswith("concat (2, 2)")]) == 2
    kept = []
    with mc.autobatch("agenda+"):
        program(kept)
        got = [v.numpy() for v in kept]
    for k, (a, value) in enumerate(zip(inputs, got)):
        x = np.tanh(a @ p["W1"].numpy()[:2, :2])
        np.testing.assert_allclose(value, np.concatenate([x, x], axis=k % 2), rtol=1e-6)


def test_the_c_recorder_keeps_the_forms_of_data_dtypes_taking_turns():
    """Ids of ten integer dtypes taking turns with float data (more than the eight dtypes the
    C recorder holds at once, so it forgets them and its forms along the way): recorded as the
    Python recorder records them, a signature per dtype."""
    p = _params(1)
    dtypes = [np.dtype(d) for d in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", ">i4", ">i8")]
    data = mc.tensor(np.full(D, 0.5, np.float32))

    def program():
        outs = []
        for turn in range(3):
            for k, dtype in enumerate(dtypes):
                x = mc.embedding(p["E"], np.array(k % 3, dtype=dtype))
                outs.append(mc.tanh(x) + data)  # (float data between the ids)
                outs.append(mc.sum(mc.embedding(p["E"], np.array([1, 2], dtype=dtype)), axis=0))
        mc.sum(mc.stack(outs))

    _same_recording(program)
    labels = _signature_labels(program)
    assert len([label for label in labels if label.startswith("take_row ")]) == len(dtypes)


def test_the_c_recorder_keys_calls_by_the_grad_mode_as_it_changes_inside_the_block():
    """The C recorder keeps this thread's grad mode (told by ``no_grad`` and ``enable_grad``
    when they change it inside the block, not read at each call): a call under ``no_grad``
    is another signature than the same call with gradients, and after the block gradients
    are recorded again — as the Python recorder does."""
    p = _params(0)

    def run(c_recorder):
        make = native.recorder
        if not c_recorder:
            native.recorder = lambda scope, types: None
        try:
            with mc.autobatch("agenda+") as ab:
                x = mc.embedding(p["E"], np.array(1))
                a = mc.tanh(x @ p["W1"])
                with mc.no_grad():
                    b = mc.tanh(x @ p["W1"])
                    with mc.enable_grad():
                        c = mc.tanh(x @ p["W1"])
                    d = mc.tanh(x @ p["W1"])
                e = mc.tanh(x @ p["W1"])
                got = sorted((s.label, s.grad_enabled, list(s.nodes)) for s in ab.active)
                grads = [t.requires_grad for t in (a, b, c, d, e)]
                ab.run_pending()
        finally:
            native.recorder = make
        return got, grads

    c, python = run(True), run(False)
    assert c == python
    assert c[1] == [True, False, True, False, True]
    assert {(label, on) for label, on, _ in c[0]} == {
        ("matmul (4,),W", False), ("matmul (4,),W", True), ("tanh (4,)", False),
        ("tanh (4,)", True), ("take_row W,()", True)}


def test_the_c_recorder_is_refused_when_a_lazy_value_has_a_slot_it_does_not_write():
    """The C code writes a lazy value's slots by name; a slot added to the Python class alone
    would be left NULL, so the recorder refuses to start and names it."""
    from minicavs.autobatch.scope import LazyTensor, LazyView

    native._check_slots(LazyTensor, LazyView)  # today's classes: every slot written

    class Extended(LazyTensor):
        __slots__ = ("_extra",)

    with pytest.raises(mc.MinicavsError, match=r"does not write slot\(s\) \['_extra'\]"):
        native._check_slots(Extended, LazyView)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(-2**62, 2**62), max_size=6), max_size=5))
def test_a_segments_recorded_ints_read_in_c_equal_numpys(lists):
    """A segment reads its signatures' recorded nodes and operand rows (lists of ints) as one
    int64 array (native.int64s: in C where the recorder builds): NumPy's ``fromiter`` of the
    same ints; anything else than lists of ints takes NumPy's way."""
    import itertools

    want = np.fromiter(itertools.chain.from_iterable(lists), np.int64)
    np.testing.assert_array_equal(native.int64s(lists), want)
    np.testing.assert_array_equal(native.int64s([tuple(x) for x in lists]), want)
    np.testing.assert_array_equal(native.int64s([[np.int64(v) for v in x] for x in lists]),
                                  want)
