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

