"""minicavs on a CUDA device (CuPy): the same models as ``minicavs_cpu``, with
``mc.set_device("cuda")``. Reported as missing where there is no GPU. ``loss.item()`` each step
synchronises, so the epoch times are real."""

from benchmarks.systems import minicavs_cpu

DEVICE = "cuda"


def available():
    return minicavs_cpu.available(DEVICE)


def run(data, params, epochs, warmup, options=None):
    return minicavs_cpu.run(data, params, epochs, warmup, options, device=DEVICE)
