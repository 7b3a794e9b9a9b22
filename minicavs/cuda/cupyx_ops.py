"""The few ``cupyx`` functions the ops call on CuPy arrays, imported here so that nothing
outside ``minicavs/cuda/`` names ``cupyx`` (the ops reach these only with CuPy arrays, so
CuPy is installed when they run)."""


def special():
    """``cupyx.scipy.special``: the GPU twin of ``scipy.special`` (erf, gammaln, ...)."""
    import cupyx.scipy.special

    return cupyx.scipy.special


def scatter_add(target, index, values):
    """``target[index[i]] += values[i]``, repeated indices adding up (``cupyx.scatter_add``)."""
    import cupyx

    cupyx.scatter_add(target, index, values)


def scatter_reduce(target, index, values, ufunc):
    """``target[index[i]] = ufunc(target[index[i]], values[i])`` for every i, in place, for
    ``ufunc`` "maximum", "minimum" (``cupyx.scatter_max``/``scatter_min``) or "multiply".
    cupyx has no scatter product: that one is computed on the host (a slow path, kept simple:
    products are the rare scatter)."""
    import cupy
    import cupyx
    import numpy

    if ufunc == "maximum":
        cupyx.scatter_max(target, index, values)
    elif ufunc == "minimum":
        cupyx.scatter_min(target, index, values)
    else:
        host = cupy.asnumpy(target)
        numpy.multiply.at(host, cupy.asnumpy(index), cupy.asnumpy(values))
        target[...] = cupy.asarray(host)
    return target
