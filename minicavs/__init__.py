"""minicavs: a small deep-learning framework for dynamic neural networks, built on the Cavs
vertex-centric execution model, on NumPy (CPU) and CuPy (GPU).

Layers (see DESIGN.md): ``backend`` picks numpy or cupy; ``ops`` defines every primitive once;
``autodiff`` holds eager Tensors, the symbolic graph builder and gradient checking; ``vertex``
runs a vertex function over batches of input graphs; ``nn`` has layers, optimisers and
checkpoints; ``cuda`` has the GPU kernels.
"""

__version__ = "0.1.0"

from .errors import (CheckpointError, DeviceError, DistributedError, DTypeError,
                     GradientCheckError, GraphError, IndexRangeError, KernelCompileError,
                     MinicavsError, ShapeError, ToolchainError)
from .backend import (default_dtype, get_array_module, get_device, gpu_available, seed,
                      set_default_dtype, set_device)
from .ops import (add, astype, broadcast_to, concat, div, embedding, equal, exp, expand_dims,
                  greater, greater_equal, less, less_equal, linear, log, log_softmax, lstm_gates,
                  matmul, max, maximum, mean, mul, neg, one_hot, pad_axis, pow, relu, reshape,
                  scatter_add_rows, sigmoid, slice_axis, softmax, softmax_cross_entropy, split,
                  squeeze, sub, sum, take_rows, tanh, transpose, where)
from .autodiff import (Graph, Parameter, Symbol, Tensor, enable_grad, gradcheck, grad_graph,
                       is_grad_enabled, no_grad, spec, trace, tensor)
from .vertex import (GraphBatch, InputGraph, StaticFunction, VertexFunction, evaluate_per_sample,
                     symbolic)
from . import nn
