"""Helpers every selector uses: memoisation and KERNELGEN_PRINT_CONFIGS printing, prewarm's
weight shapes, and the fill of a launch's waves.

A selector is a pure function from hashable problem fields to a Config; wrapping it with
`selector` makes the first choice per argument tuple print (when asked) and every later one a
dict hit. No GPU work is ever done here.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

from .. import knobs

F = TypeVar("F", bound=Callable)


def selector(fn: F) -> F:
    memo: dict = {}

    @functools.wraps(fn)
    def wrapped(*args):
        cfg = memo.get(args)
        if cfg is None:
            cfg = memo[args] = fn(*args)
            if knobs.print_configs():
                print(f"[kernelgen] {fn.__module__}.{fn.__name__}{args} -> {cfg.short()}",
                      file=sys.stderr)
        return cfg

    wrapped.cache_clear = memo.clear  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


def weight_shapes(spec: dict, family: str,
                  check_shape: Callable[..., None]) -> list[tuple[int | None, int, int]]:
    """A prewarm spec's "shapes" of GEMM weights: [N, K] (every M) or [M, N, K] (that M) ->
    (M or None, N, K), each checked by the family's `check_shape(n, k, name=...)` (a ValueError
    becomes UnsupportedConfigError, what prewarm reports as a bad spec)."""
    from ..errors import UnsupportedConfigError

    out = []
    for s in spec.get("shapes") or ():
        if not isinstance(s, (list, tuple)) or len(s) not in (2, 3):
            raise UnsupportedConfigError(f"{family} spec shapes: {s!r}; expected [N, K] or [M, N, K]")
        m, n, k = (None, *s) if len(s) == 2 else s
        try:
            check_shape(int(n), int(k), name=f"spec shape {list(s)}")
        except ValueError as e:
            raise UnsupportedConfigError(str(e)) from None
        out.append((None if m is None else int(m), int(n), int(k)))
    return out


def wave_fill(ctas: int, slots: int) -> float:
    """The mean fill of the waves of `ctas` CTAs over `slots` resident at once (SMs x CTAs an
    SM): 1.0 where the last wave is full, just above 0.5 where it holds one CTA of two waves."""
    return ctas / (-(-ctas // slots) * slots)
