"""Routing cases shared by the CPU and GPU tests: (name, T, top_k, E) -> topk_ids [T, top_k]."""

from __future__ import annotations

import numpy as np


def routing(case: str, t: int, k: int, e: int, seed: int = 0) -> np.ndarray:
    """topk_ids int64 [t, k] for a named routing pattern."""
    rng = np.random.default_rng(seed + 7919 * t + 31 * k + e)
    if case == "uniform":  # distinct experts per token, as a softmax top-k gives
        ids = np.argsort(rng.random((t, e)), axis=1)[:, :k] if k <= e else rng.integers(0, e, (t, k))
    elif case == "hot80":  # 80% of the tokens name experts 0..k-1 (expert 0 on every one)
        ids = rng.integers(0, e, (t, k))
        hot = rng.random(t) < 0.8
        ids[hot] = np.arange(k) % e
    elif case == "one_expert":  # every pair to one expert (the token names it k times)
        ids = np.full((t, k), e // 2)
    elif case == "zero_rows":  # only even experts get rows
        ids = 2 * rng.integers(0, max(1, e // 2), (t, k))
    elif case == "duplicates":  # a token names the same expert twice or more
        ids = rng.integers(0, e, (t, k))
        if k > 1:
            ids[:, 1] = ids[:, 0]
    else:
        raise ValueError(case)
    return ids.astype(np.int64)


CASES = ("uniform", "hot80", "one_expert", "zero_rows", "duplicates")
