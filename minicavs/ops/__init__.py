"""The op library. Primitives live in the modules below, one definition each (see
``registry.py``); composites are written with them. Everything here works on eager Tensors,
on Symbols while tracing, and on plain arrays (which run eagerly)."""

from .registry import OPS, Aval, Op, apply
from .elementwise import (add, astype, div, equal, exp, greater, greater_equal, less, less_equal,
                          log, maximum, mul, neg, pow, relu, sigmoid, sub, tanh, unbroadcast, where)
from .reduce import max, mean, sum
from .shape import (broadcast_to, concat, expand_dims, pad_axis, reshape, slice_axis, split,
                    squeeze, transpose)
from .linalg import matmul
from .index import embedding, one_hot, scatter_add_rows, take_rows
from .loss import softmax_cross_entropy
from .composite import linear, log_softmax, lstm_gates, softmax
from .operators import OperatorMixin

PRIMITIVES = sorted(OPS)
