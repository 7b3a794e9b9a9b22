"""Automatic differentiation: eager Tensors (``tensor.py``), traced symbolic graphs
(``symbolic.py``) and their symbolic backward, and gradient checking."""

from .tensor import (Parameter, Tensor, enable_grad, from_dlpack, is_grad_enabled, no_grad,
                     tensor)
from .gradcheck import gradcheck
from .symbolic import BackwardGraph, Graph, Symbol, grad_graph, spec, trace
