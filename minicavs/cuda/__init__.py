"""The CUDA layer: GPU kernels, and the means to check them on machines without a GPU.

* ``kernels``  — the Cavs row-copy RawKernels (gather_rows, gather_children, scatter_add_rows
  atomic and deterministic, scatter_rows, copy_rows, pull_rows, push_rows), each from a memoised
  (kernel, dtype) factory, checked before launch, with a NumPy twin defining its semantics;
* ``nvrtc``    — compile any kernel source to PTX with NVRTC (no GPU needed), errors with the log;
  the options every kernel gets, and those CuPy adds (``-ftz=true``) with its CUDA headers;
* ``shim``     — compile the same source with g++ behind a small header and run it on the CPU,
  one (block, thread) at a time, float32 with subnormals flushed as on the GPU; also wraps
  elementwise bodies into runnable kernels;
* ``fusion``   — fused elementwise groups as one generated ``cupy.ElementwiseKernel`` each
  (the executor's fused-kernel factory for CuPy, imported on first use), and the same body as a
  RawKernel for NVRTC and the shim;
* ``streams``  — the two-stream scheduler of the vertex runtime (critical path on the main
  stream, independent work on a side stream, ordered with events; a no-op on NumPy);
* ``nccl``     — NCCL through ``cupy.cuda.nccl`` for the data-parallel all-reduce of
  ``minicavs.distributed`` (unique id over MPI, in-place collectives waited on with a deadline);
* ``cupyx_ops`` — the ``cupyx`` functions the ops call on CuPy arrays (nothing else names cupyx);
* ``emulated`` — the emulated CUDA device (``MINICAVS_CUDA_EMULATE=1``): a CuPy stand-in on
  host arrays, kernels through the shim, every launch counted for ``explain()``;
* ``doctor``   — ``python -m minicavs doctor``: what is installed, what is missing, and one
  kernel compiled as CuPy compiles it and run through the shim and, where there is one, the GPU.

``README.md`` here lists what these CPU checks establish and what only a GPU can show.
Nothing here imports CuPy at import time; ``minicavs.backend`` decides numpy or cupy.
"""
