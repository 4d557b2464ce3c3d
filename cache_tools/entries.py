"""Reading cache entries for the CLI: fields for tables, filters, selection by key prefix."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kernelgen.arch import ALL_ARCHS
from kernelgen.core.cache import DiskCache, Entry
from kernelgen.core.compile import resource_summary
from kernelgen.core.registry import families

from . import UsageError
from .table import err, human_age, human_bytes
from .values import parse_days, split_list


def parts(e: Entry) -> dict[str, Any]:
    return e.manifest.get("parts", {})


def family(e: Entry) -> str:
    return str(parts(e).get("family", "?"))


def arch(e: Entry) -> str:
    return str(parts(e).get("arch", "?"))


def kind(e: Entry) -> str:
    return str(e.config_dict().get("kind", "?"))


def fields_text(config: dict[str, Any]) -> str:
    """The config fields that have no column of their own: 'bits=4 dtype=float16'."""
    return " ".join(f"{k}={v}" for k, v in config.items() if k not in ("family", "kind", "arch"))


def layer(e: Entry) -> str:
    return "ro" if e.readonly else "rw"


def row(e: Entry) -> dict[str, Any]:
    """Everything `cache ls` knows about an entry, as JSON-ready values."""
    res = resource_summary(e.manifest.get("compile_log", ""))
    return {
        "key": e.key,
        "family": family(e),
        "kind": kind(e),
        "config": e.config_dict(),
        "arch": arch(e),
        "cubin_size": e.size,
        "registers": res["registers"],
        "spill_bytes": res["spill_bytes"],
        "compile_seconds": e.manifest.get("compile_seconds"),
        "created": e.manifest.get("created"),
        "last_used": e.last_used,
        "package_version": parts(e).get("package_version"),
        "nvrtc": parts(e).get("nvrtc"),
        "layer": layer(e),
        "path": str(e.path),
    }


def table_row(r: dict[str, Any], now: float) -> list[Any]:
    secs = r["compile_seconds"]
    return [
        r["key"][:12], r["family"], r["kind"], fields_text(r["config"]), r["arch"],
        human_bytes(r["cubin_size"]), _or_dash(r["registers"]), _or_dash(r["spill_bytes"]),
        "-" if secs is None else f"{secs:.2f}s", human_age(r["last_used"], now), r["layer"],
    ]


TABLE_HEADERS = ("KEY", "FAMILY", "KIND", "CONFIG", "ARCH", "CUBIN", "REGS", "SPILL", "COMPILE",
                 "USED", "LAYER")
TABLE_RIGHT = ("CUBIN", "REGS", "SPILL", "COMPILE", "USED")


@dataclass(frozen=True)
class Filter:
    """Entry filters shared by ls / gc / purge / export. Empty fields match everything."""

    families: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()
    older_than_s: float | None = None  # last used longer ago than this
    stale_package: bool = False  # package version or NVRTC differs from this installation
    stale_nvrtc: bool = False  # NVRTC differs from this installation
    nvrtc_now: str = ""
    package_now: str = ""

    @property
    def empty(self) -> bool:
        return not (self.families or self.archs or self.older_than_s is not None
                    or self.stale_package or self.stale_nvrtc)

    def __call__(self, e: Entry, now: float) -> bool:
        p = parts(e)
        if self.families and family(e) not in self.families:
            return False
        if self.archs and arch(e) not in self.archs:
            return False
        if self.older_than_s is not None and now - e.last_used <= self.older_than_s:
            return False
        nvrtc_old = p.get("nvrtc") != self.nvrtc_now
        if self.stale_nvrtc and not nvrtc_old:
            return False
        if self.stale_package and not (nvrtc_old or p.get("package_version") != self.package_now):
            return False
        return True


def check_names(cache: DiskCache, flt: Filter, known_families: Iterable[str], known_archs: Iterable[str]) -> None:
    """A --family/--arch value must be registered or seen in the cache: a typo must not match
    nothing silently (above all in purge)."""
    seen = [e for e in cache.entries() if not e.problem]
    for flag, values, known, getter in (
        ("--family", flt.families, set(known_families), family),
        ("--arch", flt.archs, set(known_archs), arch),
    ):
        allowed = known | {getter(e) for e in seen}
        for v in values:
            if v not in allowed:
                order = {a: i for i, a in enumerate(ALL_ARCHS)}  # targets in their own order
                names = sorted(allowed, key=lambda x: (order.get(x, len(order)), x))
                raise UsageError(f"{flag} {v!r}: unknown; known values: {', '.join(names)}")


def select(cache: DiskCache, flt: Filter, include_readonly: bool = True) -> Iterator[Entry]:
    """The entries `flt` matches; damaged ones (no usable manifest) never: see note_damaged."""
    now = time.time()
    for e in cache.entries(include_readonly=include_readonly):
        if not e.problem and flt(e, now):
            yield e


def note_damaged(cache: DiskCache) -> None:
    """One line on stderr when some entries are damaged, which the commands that read manifests
    skip (ls, info, gc and purge filters, export)."""
    n = sum(1 for e in cache.entries() if e.problem)
    if n:
        err(f"kernelgen: skipped {n} damaged entr{'y' if n == 1 else 'ies'} (manifest unusable); "
            f"`kernelgen cache verify` names them, `--fix` removes them")


def by_prefix(cache: DiskCache, prefix: str) -> Entry:
    """The entry whose key starts with `prefix` (first layer in lookup order if several hold it)."""
    prefix = prefix.strip().lower()
    if len(prefix) < 4:
        raise UsageError(f"key prefix {prefix!r}: give at least 4 characters (see `kernelgen cache ls`)")
    found = [e for e in cache.entries() if e.key.startswith(prefix)]
    keys = sorted({e.key for e in found})
    if not keys:
        raise UsageError(f"no cache entry has a key starting with {prefix!r}")
    if len(keys) > 1:
        raise UsageError(f"key prefix {prefix!r} is ambiguous ({len(keys)} keys: "
                         f"{', '.join(k[:16] for k in keys[:5])}...); give more characters")
    return found[0]


def add_filter_args(p: argparse.ArgumentParser, older: bool = True) -> None:
    p.add_argument("--family", action="append", metavar="LIST", help="only these families (comma-separated)")
    p.add_argument("--arch", action="append", metavar="LIST", help="only these archs (comma-separated)")
    if older:
        p.add_argument("--older-than", metavar="DAYS", help="only entries last used more than DAYS ago")


def make_filter(args: argparse.Namespace, cache: DiskCache, **extra: Any) -> Filter:
    """The Filter of the --family/--arch/--older-than flags, names checked against the cache."""
    older = getattr(args, "older_than", None)
    flt = Filter(
        families=tuple(split_list(args.family, "--family")),
        archs=tuple(split_list(args.arch, "--arch")),
        older_than_s=parse_days(older) if older is not None else None,
        **extra,
    )
    check_names(cache, flt, families(), ALL_ARCHS)
    note_damaged(cache)
    return flt


def _or_dash(v: Any) -> Any:
    """'-' where the ptxas report was missing (None), the value otherwise."""
    return "-" if v is None else v
