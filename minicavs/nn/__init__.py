"""Layers, optimisers and checkpoints: ``Module`` (parameters found automatically, state dicts),
``Linear`` and ``Embedding``, initialisers in ``init``, ``SGD``/``Adam``/``Adagrad`` in
``optim``, and atomic ``save_checkpoint``/``load_checkpoint``."""

from ..autodiff import Parameter
from . import init, optim
from .module import Embedding, Linear, Module
from .optim import SGD, Adagrad, Adam, Optimizer, clip_grad_norm
from .checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint

__all__ = ["Module", "Linear", "Embedding", "Parameter", "init", "optim", "Optimizer", "SGD",
           "Adam", "Adagrad", "clip_grad_norm", "save_checkpoint", "load_checkpoint",
           "FORMAT_VERSION"]
