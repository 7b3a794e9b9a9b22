"""minicavs: a small deep-learning framework for dynamic neural networks, built on the Cavs
vertex-centric execution model, on NumPy (CPU) and CuPy (GPU).

Layers (see DESIGN.md): ``backend`` picks numpy or cupy; ``ops`` defines every primitive once;
``autodiff`` holds eager Tensors, the symbolic graph builder and gradient checking; ``vertex``
holds the front-ends (vertex functions, kinds, recursive definitions, growth, static
functions) and ``runtime`` the Programs they make and the one driver that runs them, on the
interpreter or the native code; ``nn`` has layers, optimisers and checkpoints; ``cpu`` the
native toolchain; ``cuda`` the GPU kernels.
"""

__version__ = "0.1.0"

from .cpu.malloc import keep_freed_memory as _keep_freed_memory

_keep_freed_memory()  # freed temporaries reused, not re-faulted each batch (cpu/malloc.py)

from .cpu.blas import let_idle_threads_sleep as _let_idle_threads_sleep

_let_idle_threads_sleep()  # OpenBLAS's threads stop spinning on the team's cores (cpu/blas.py)

from .errors import (ArgumentError, CheckpointError, CheckpointWriteError, DeviceError,
                     DistributedError, DTypeError, GradientCheckError, GraphError,
                     IndexRangeError, InPlaceModificationError, KernelCompileError, MinicavsError,
                     NonFiniteError, OutOfMemoryError, ShapeError, ToolchainError,
                     TracedBranchError, UnsupportedError)
from .backend import (default_dtype, get_array_module, get_device, gpu_available, seed,
                      set_default_dtype, set_device)
from .cpu.denormals import set_flush_denormal
from .ops import (abs, add, add_n, all, any, argmax, argmin, astype, binary_cross_entropy,
                  binary_cross_entropy_with_logits, broadcast_to, ceil, clip, concat, cos,
                  cross_entropy, cumsum, div, elu, embedding, equal, erf, exp, expand_dims,
                  expm1, flatten, flip, floor, gather, gelu, greater, greater_equal, hardtanh,
                  isfinite, isinf, isnan, leaky_relu, less, less_equal, linear, log, log1p,
                  log_softmax, logical_and, logical_not, logical_or, logical_xor, logsumexp,
                  lstm_cell, lstm_gates, lstm_step, masked_fill, matmul, max, maximum, mean,
                  min, minimum, moveaxis, mul, neg, nll_loss, not_equal, one_hot, pad,
                  pad_axis, pow, prod, relu, repeat,
                  reshape, result_dtype, rint, round, rsqrt, scatter_add_rows, sigmoid, sign,
                  silu, sin, slice_axis, softmax, softmax_cross_entropy, softplus, split, sqrt,
                  squeeze, stack, std, sub, sum, take, take_rows, tanh, tile, transpose, tril,
                  triu, var, where)
from .ops import (SortResult, allclose, argsort, bitwise_and, bitwise_not, bitwise_or,
                  bitwise_xor, copysign, cummax, cummin, cumprod, einsum, floor_divide, fmod,
                  isclose, left_shift, mod, put_along_axis_add, remainder, right_shift, roll,
                  scatter, scatter_add, scatter_reduce, sort, take_along_axis, topk, trunc,
                  unique)
from .ops import (adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, avg_pool3d,
                  conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, fold,
                  interpolate, max_pool1d, max_pool2d, max_pool3d, unfold)
from .autodiff import (Graph, Parameter, Symbol, Tensor, enable_grad, from_dlpack, gradcheck,
                       grad_graph, is_grad_enabled, no_grad, spec, trace, tensor)
from .autodiff.creation import (arange, eye, full, full_like, ones, ones_like, rand, rand_like,
                                randn, randn_like, zeros, zeros_like)
from .autodiff.debug import debug, is_debug_enabled, set_debug
from .vertex import (GraphBatch, InputGraph, KindedFunction, RecursiveFunction, StaticFunction,
                     VertexFunction, evaluate_per_sample, grow, grow_per_sample, recursive,
                     symbolic, top_down)
from .autobatch import autobatch
from .runtime.memory import memory_budget, set_memory_budget
from . import nn
from .nn import load, save
