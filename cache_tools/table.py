"""Output helpers: aligned text tables, human sizes and ages, JSON to stdout."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (powers of 1024, as the size knobs)."""
    if n < 1024:
        return f"{n:.0f} B"
    units = ("KiB", "MiB", "GiB", "TiB")
    i = 0
    n /= 1024
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.1f} {units[i]}"


def human_age(timestamp: float, now: float | None = None) -> str:
    """'12s', '5m', '3h', '2d' since `timestamp` (epoch seconds); '-' if unknown."""
    if not timestamp:
        return "-"
    s = max(0.0, (now if now is not None else time.time()) - timestamp)
    for limit, div, unit in ((60, 1, "s"), (3600, 60, "m"), (86400, 3600, "h")):
        if s < limit:
            return f"{s / div:.0f}{unit}"
    return f"{s / 86400:.0f}d"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[str] = ()) -> str:
    """Columns padded to their widest cell; columns named in `right` are right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if h in right else c.ljust(w)
            for c, w, h in zip(r, widths, headers, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def err(msg: str) -> None:
    """A line for the user on stderr (progress, warnings, errors)."""
    print(msg, file=sys.stderr, flush=True)
