"""Gradient buckets: parameters packed into a few flat buffers, so that a collective is one call
per bucket, not one per parameter (a Tree-LSTM has a handful of parameters, a deeper model
hundreds, and every call pays the network's latency once).

A bucket holds consecutive parameters of one dtype and device, up to a byte budget (a larger
parameter gets a bucket of its own). For gradients the buffer ends with one *flag* per parameter:
1 where this rank has a gradient, 0 where it has none (the parameter took no part in its loss,
or the rank had no samples this step). After the sum, a parameter whose flags add up to 0 gets
no gradient on any rank, exactly as in one process, where the optimiser then skips it; any
other gets the summed gradient, a rank without one contributing zeros.
"""

from dataclasses import dataclass

import numpy as np

from .. import backend
from ..autodiff import Tensor
from ..errors import DTypeError, ShapeError
from ..ops.registry import describe


@dataclass(frozen=True)
class Bucket:
    """Parameters ``indices`` (positions in the parameter list), laid out at ``offsets`` in one
    flat buffer of ``dtype`` on ``device``; ``elements`` is their total size."""

    indices: tuple
    offsets: tuple
    elements: int
    dtype: np.dtype
    device: str


def plan_buckets(params, bucket_bytes):
    """Cut ``params`` (in order) into buckets of at most ``bucket_bytes`` each."""
    buckets, current = [], []

    def close():
        if current:
            offsets = tuple(int(o) for o in np.cumsum([0] + [params[i].size
                                                             for i in current[:-1]]))
            elements = int(sum(params[i].size for i in current))
            first = params[current[0]]
            buckets.append(Bucket(tuple(current), offsets, elements, np.dtype(first.dtype),
                                  first.device))
            current.clear()

    used = 0
    for i, p in enumerate(params):
        nbytes = p.size * np.dtype(p.dtype).itemsize
        if current:
            first = params[current[0]]
            if (np.dtype(p.dtype) != np.dtype(first.dtype) or p.device != first.device
                    or used + nbytes > bucket_bytes):
                close()
                used = 0
        current.append(i)
        used += nbytes
    close()
    return buckets


def pack_gradients(bucket, params):
    """A fresh flat buffer: the bucket's gradients (zeros where missing), then the flags."""
    xp = backend.get_array_module(params[bucket.indices[0]].data)
    buffer = xp.empty(bucket.elements + len(bucket.indices), dtype=bucket.dtype)
    for k, (i, start) in enumerate(zip(bucket.indices, bucket.offsets)):
        p = params[i]
        stop = start + p.size
        if p.grad is None:
            buffer[start:stop] = 0
            buffer[bucket.elements + k] = 0
            continue
        grad = p.grad.data
        if grad.shape != p.shape:
            raise ShapeError(f"allreduce_gradients: parameter {i} has shape {describe(p.shape)}, "
                             f"its grad has shape {describe(grad.shape)}")
        if grad.dtype != p.dtype:
            raise DTypeError(f"allreduce_gradients: parameter {i} has dtype {p.dtype}, its grad "
                             f"has dtype {grad.dtype}")
        buffer[start:stop] = grad.reshape(-1)
        buffer[bucket.elements + k] = 1
    return buffer


def unpack_gradients(bucket, params, buffer, scale=1.0):
    """Give each parameter of ``bucket`` its summed gradient (times ``scale``) as a view of
    ``buffer``, or None where no rank had one. The buffer is this step's own, so the views
    share memory with nothing a caller holds."""
    flags = backend.to_numpy(buffer[bucket.elements:])
    values = buffer[:bucket.elements]
    if scale != 1.0:
        values *= scale
    for k, (i, start) in enumerate(zip(bucket.indices, bucket.offsets)):
        p = params[i]
        p.grad = Tensor(values[start:start + p.size].reshape(p.shape)) if flags[k] > 0 else None


def pack_values(bucket, params):
    """A flat buffer holding the bucket's parameter values."""
    xp = backend.get_array_module(params[bucket.indices[0]].data)
    buffer = xp.empty(bucket.elements, dtype=bucket.dtype)
    for i, start in zip(bucket.indices, bucket.offsets):
        buffer[start:start + params[i].size] = params[i].data.reshape(-1)
    return buffer


def unpack_values(bucket, params, buffer):
    """Copy ``buffer`` into the parameters in place (vertex functions and optimisers hold the
    parameters' arrays, so they must stay the same objects)."""
    xp = backend.get_array_module(buffer)
    for i, start in zip(bucket.indices, bucket.offsets):
        p = params[i]
        xp.copyto(p.data, buffer[start:start + p.size].reshape(p.shape))
