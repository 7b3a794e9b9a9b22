"""Views: values the recorder makes without a node, as NumPy makes views without a copy
(docs/autobatch.md, "How it works" 5).

A slice of the last axis of a pending value, or a reshape of one, is recorded as a *view* of
the pending node (``scope.LazyView``): no node, no batch, no copy. A reader binds the base
node's rows through it (``ViewKey.of``), and its gradient is added back through the same view.
A view is not part of its reader's signature: the recorder tags the operand's source instead
(the node's index plus ``ViewKey.tag``, a code in the high bits), and a batch whose operand rows
come in several forms gathers each form's rows (``segment.py``).
"""

from ..ops.registry import Aval


class ViewKey:
    """The form of a view of values of ``base`` (an Aval): the columns ``start:stop`` of their
    last axis, or their elements as ``shape``. ``aval``: the view's own. One object per form
    (:func:`view_key`): signatures compare it, and the recording fast path keys it, by
    identity."""

    __slots__ = ("base", "start", "stop", "shape", "aval", "tag")

    def __init__(self, base, start, stop, shape):
        self.base, self.start, self.stop, self.shape = base, start, stop, shape
        BY_CODE.append(self)
        self.tag = (len(BY_CODE) - 1) << SHIFT  # added to the index of a source read through it
        if shape is None:
            shape = tuple(base.shape[:-1]) + (stop - start,)
        self.aval = Aval(tuple(shape), base.dtype)

    @property
    def is_columns(self):
        return self.shape is None

    def of(self, rows):
        """The view of a block of the base's rows (leading axis: rows). A reshape needs the
        block contiguous per row, as slabs and gathered blocks are."""
        if self.shape is None:
            return rows[..., self.start:self.stop]
        return rows.reshape(rows.shape[:1] + self.shape)

    def of_value(self, value):
        """The view of one value of the base."""
        return self.of(value[None])[0]


SHIFT = 40  # a source's bits above this hold its view's code (node indices stay below 2**40)
INDEX = (1 << SHIFT) - 1
BY_CODE = [None]  # code -> ViewKey; code 0: no view
_BY_FORM = {}  # (base Aval, start, stop, shape) -> its ViewKey
_BY_ID = {}  # (id of a base Aval object, start, stop, shape) -> (that Aval, kept alive; key)


def view_key(base, start=None, stop=None, shape=None):
    """The one ViewKey of this form (the columns ``start:stop`` or the reshape to ``shape``)
    of values of the Aval ``base``. Looked up by the Aval object's identity first: a recorded
    node's Aval is its signature's, shared by every node of it."""
    found = _BY_ID.get((id(base), start, stop, shape))
    if found is None:
        form = (base, start, stop, shape)
        key = _BY_FORM.get(form)
        if key is None:
            key = _BY_FORM[form] = ViewKey(base, start, stop, shape)
        found = _BY_ID[(id(base), start, stop, shape)] = (base, key)
    return found[1]
