"""What the two PyTorch peers share: the import check, threads, and the weights as Parameters.

Weights are stored the way ``torch.nn.functional.linear`` wants them, (out, in), so every
product is one ``addmm`` with the bias fused, as ``nn.Linear`` does.
"""

import os


def available():
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 (any failure to import means "missing")
        return f"torch not importable ({type(exc).__name__}: {exc}); pip install torch==2.13.0"
    threads = int(os.environ.get("BENCH_THREADS", "0") or 0)
    if threads:
        torch.set_num_threads(threads)
    return None


def parameters(params):
    """The common initial weights as torch Parameters: matrices transposed to (out, in)."""
    import torch

    def p(array, transpose=False):
        tensor = torch.from_numpy(array.T.copy() if transpose else array.copy())
        return torch.nn.Parameter(tensor)

    return {
        "emb": p(params["emb"]), "W": p(params["W"], True), "U": p(params["U"], True),
        "b": p(params["b"]), "W_out": p(params["W_out"], True), "b_out": p(params["b_out"]),
    }


def version():
    import torch

    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "mkldnn": bool(torch.backends.mkldnn.is_available())}
