"""Arrays for the core GPU tests: a small MoE layer's inputs, device results on the host."""

from __future__ import annotations

import numpy as np

E, HIDDEN, INTER, TOKENS, TOP_K = 8, 256, 128, 37, 2


def moe_layer(put, rng) -> tuple:
    """(x [T, H] fp16, topk_ids [T, top_k] int32, topk_weights fp32, w13 [E, 2I, H], w2 [E, H, I]),
    each host array placed by `put`."""
    x = put((rng.standard_normal((TOKENS, HIDDEN)) * 0.5).astype(np.float16))
    ids = put(rng.integers(0, E, (TOKENS, TOP_K)).astype(np.int32))
    wts = put(rng.random((TOKENS, TOP_K)).astype(np.float32))
    w13 = put((rng.standard_normal((E, 2 * INTER, HIDDEN)) * 0.05).astype(np.float16))
    w2 = put((rng.standard_normal((E, HIDDEN, INTER)) * 0.05).astype(np.float16))
    return x, ids, wts, w13, w2


def host(x) -> np.ndarray:
    """A CuPy array or torch tensor on the host (torch bf16 as float32)."""
    import cupy

    if hasattr(x, "is_cuda"):
        import torch

        x = x.detach()
        return (x.float() if x.dtype == torch.bfloat16 else x).cpu().numpy()
    return cupy.asnumpy(x)
