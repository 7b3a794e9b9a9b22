"""The few ``cupyx`` functions the ops call on CuPy arrays, imported here so that nothing
outside ``minicavs/cuda/`` names ``cupyx`` (the ops reach these only with CuPy arrays, so
CuPy is installed when they run)."""


def special():
    """``cupyx.scipy.special``: the GPU twin of ``scipy.special`` (erf, gammaln, ...)."""
    from ..backend import cuda_emulated

    if cuda_emulated():
        from .emulated import special

        return special
    import cupyx.scipy.special

    return cupyx.scipy.special


def scatter_add(target, index, values):
    """``target[index[i]] += values[i]``, repeated indices adding up (``cupyx.scatter_add``)."""
    from ..backend import cuda_emulated

    if cuda_emulated():
        from .emulated import scatter_add as emulated_scatter_add

        return emulated_scatter_add(target, index, values)
    import cupyx

    cupyx.scatter_add(target, index, values)

