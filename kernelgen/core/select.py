"""Helpers every selector uses: memoisation and KERNELGEN_PRINT_CONFIGS printing.

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
