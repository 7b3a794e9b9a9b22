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


def parameters(params, device="cpu"):
    """The common initial weights as torch Parameters on ``device``: matrices transposed to
    (out, in)."""
    import torch

    def p(array, transpose=False):
        tensor = torch.from_numpy(array.T.copy() if transpose else array.copy())
        return torch.nn.Parameter(tensor.to(device))

    extra = {"V": p(params["V"])} if "V" in params else {}  # RNTN: (H, 2H, 2H) as it is
    return {
        **extra,
        "emb": p(params["emb"]), "W": p(params["W"], True), "U": p(params["U"], True),
        "b": p(params["b"]), "W_out": p(params["W_out"], True), "b_out": p(params["b_out"]),
    }


def version(device="cpu"):
    import torch

    info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "mkldnn": bool(torch.backends.mkldnn.is_available())}
    if device == "cuda":
        info.update(device=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                    tf32=bool(torch.backends.cuda.matmul.allow_tf32))
    return info
