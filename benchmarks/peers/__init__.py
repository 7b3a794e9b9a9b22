"""The peer systems: PyTorch eager (one graph per sample), PyTorch hand-batched (DGL's level
schedule; the perfect reshape for Tree-FC; nn.LSTM over a packed batch), and DyNet with
automatic batching. Each module has ``available()`` and ``run(data, params, epochs, warmup,
options)``, like ``benchmarks/systems/minicavs_cpu.py``."""
