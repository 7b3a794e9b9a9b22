"""The minicavs systems of the benchmark: ``minicavs_cpu`` (NumPy) and ``minicavs_cuda``
(CuPy), with the interface of the peers (``available()``, ``run(...)``)."""
