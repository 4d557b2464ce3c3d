"""Parsing and checking of flag values: lists, sizes, ages, archs, families, `--set k=v`.

Every failure raises UsageError naming the flag, the value and what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from kernelgen import arch as _arch
from kernelgen import knobs
from kernelgen.core.registry import Family, families
from kernelgen.errors import DeviceError

from . import UsageError


def split_list(values: Iterable[str] | None, flag: str) -> list[str]:
    """`--x a,b --x c` -> ['a', 'b', 'c'] (order kept, duplicates dropped). A flag given with
    nothing in it (`--arch ''`, `--arch ,`) is an error naming `flag`, not "no flag": it would
    otherwise fall back to the defaults (build or list everything) in silence."""
    out: list[str] = []
    for v in values or ():
        for p in v.split(","):
            if p.strip() and p.strip() not in out:
                out.append(p.strip())
    if values and not out:
        raise UsageError(f"{flag} {','.join(values)!r}: an empty list; name at "
                         "least one value (leave the option out for the default)")
    return out


def int_list(flag: str, values: Iterable[str] | None) -> list[int]:
    items = split_list(values, flag)
    try:
        return [int(v) for v in items]
    except ValueError:
        raise UsageError(f"{flag} {','.join(items)}: expected integers such as 2,4") from None


def parse_size(text: str) -> int:
    """'500M', '2G', '1.5GiB', '123456' -> bytes (the grammar of kernelgen.knobs.parse_size)."""
    size = knobs.parse_size(text)
    if size is None:
        raise UsageError(f"--max-bytes {text!r}: expected a size such as 500M, 2G or 123456")
    return size


def parse_days(text: str) -> float:
    """'--older-than 7' or '1.5' days -> seconds."""
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not 0 <= days < math.inf:  # nan would match every entry (every comparison is False)
        raise UsageError(f"--older-than {text!r}: expected a number of days such as 7 or 0.5")
    return days * 86400.0


def coerce(text: str) -> int | bool | str:
    """A `--set` value: int if it is digits, bool for true/false, otherwise the string."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_sets(items: Iterable[str] | None) -> dict[str, int | bool | str]:
    out: dict[str, int | bool | str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set bits=4")
        out[name.strip()] = coerce(value.strip())
    return out


def default_arch() -> str:
    """The local GPU's target if there is one, else sm_90a (the GPUs we run on: H100/H200)."""
    return native_arch() if _arch.gpu_available() else "sm_90a"


def native_arch() -> str:
    if not _arch.gpu_available():
        raise UsageError("--arch native: no CUDA device here; name the targets, e.g. --arch sm_90a")
    try:
        return _arch.device_info().arch.name
    except DeviceError as e:
        raise UsageError(f"--arch native: {e}") from None


def resolve_archs(tokens: Iterable[str], where: str = "--arch") -> list[str]:
    """Names, 'all' (every target) or 'native' (this machine's GPU) -> validated arch names;
    `where` names the source in errors (the flag, or a profile's "archs")."""
    out: list[str] = []
    for tok in tokens:
        names = list(_arch.ALL_ARCHS) if tok == "all" else [native_arch()] if tok == "native" else [tok]
        for name in names:
            if name not in _arch.ARCHS:
                raise UsageError(
                    f"{where} {name!r}: not a kernelgen target; choose from "
                    f"{', '.join(_arch.ALL_ARCHS)}, all, native"
                )
            if name not in out:
                out.append(name)
    return out


def resolve_families(names: Iterable[str]) -> dict[str, Family]:
    known = families()
    out: dict[str, Family] = {}
    for name in names:
        if name not in known:
            raise UsageError(f"--family {name!r}: unknown; registered families: {', '.join(sorted(known))}")
        out[name] = known[name]
    return out
