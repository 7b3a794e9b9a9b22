"""Layers, optimisers and checkpoints: ``Module`` (parameters found automatically, state dicts,
train/eval), ``Linear``, ``Embedding``, ``Sequential``, ``Dropout``, ``LayerNorm``, the
activations, ``LSTMCell``/``LSTM`` and ``GRUCell``/``GRU``, the convolution and pooling
layers (``Conv2d``, ``MaxPool2d``, ... in ``conv``); initialisers in ``init``;
``SGD``/``Adam``/``AdamW``/``Adagrad`` with parameter groups in ``optim`` and LR schedules in
``schedulers``; atomic ``save_checkpoint``/``load_checkpoint`` and ``save``/``load`` (also
``mc.save``/``mc.load``) of state dicts."""

from ..autodiff import Parameter
from . import init, optim, schedulers
from .module import Embedding, Linear, Module
from .layers import (ELU, GELU, Dropout, Identity, LayerNorm, LeakyReLU, LogSoftmax, ReLU,
                     Sequential, Sigmoid, SiLU, Softmax, Softplus, Tanh, dropout)
from .recurrent import GRU, LSTM, GRUCell, LSTMCell
from .conv import (AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d,
                   Flatten, MaxPool2d, Upsample)
from .optim import SGD, Adagrad, Adam, AdamW, CombinedOptimizer, Optimizer, clip_grad_norm
from .schedulers import CosineAnnealingLR, LambdaLR, LinearWarmup, LRScheduler, StepLR
from .checkpoint import FORMAT_VERSION, load, load_checkpoint, save, save_checkpoint

__all__ = ["Module", "Linear", "Embedding", "Sequential", "Dropout", "dropout", "LayerNorm",
           "Identity", "ReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "ELU", "LeakyReLU", "Softplus",
           "Softmax", "LogSoftmax", "LSTMCell", "LSTM", "GRUCell", "GRU", "Parameter", "init",
           "optim", "schedulers", "Optimizer", "SGD", "Adam", "AdamW", "Adagrad",
           "CombinedOptimizer", "clip_grad_norm", "LRScheduler", "StepLR", "LinearWarmup",
           "CosineAnnealingLR", "LambdaLR", "save_checkpoint", "load_checkpoint", "save", "load",
           "FORMAT_VERSION", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "MaxPool2d",
           "AvgPool2d", "AdaptiveAvgPool2d", "Upsample", "Flatten"]
