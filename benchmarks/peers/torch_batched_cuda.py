"""PyTorch batched by hand (``torch_batched``: DGL's level schedule for the Tree-LSTM, the
perfect reshape for Tree-FC, ``nn.LSTM`` over a PackedSequence), on a CUDA device: the peer of
minicavs-cuda. Reported as missing without a GPU, or with a CPU-only build of PyTorch
(``pip install torch==2.13.0`` from PyPI is the CUDA 12 build on Linux)."""

from benchmarks.peers import _torch, torch_batched

DEVICE = "cuda"


def available():
    reason = _torch.available()
    if reason:
        return reason
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no CUDA device visible to torch {torch.__version__} ({build})"
    return None


def run(data, params, epochs, warmup, options=None):
    return torch_batched.run(data, params, epochs, warmup, options, device=DEVICE)
