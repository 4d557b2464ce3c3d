"""`kernelgen cache verify | gc | purge`: find broken entries, cap the size, remove by filter.

Only the writable layer is ever changed; read-only layers (a cache baked into an image) are
reported, never touched.

    verify [--fix]                 entries whose cubin/manifest do not match (exit 1 if any remain)
    gc [--max-bytes 2G]            evict least recently used entries until the layer fits
                                   (default: the KERNELGEN_CACHE_MAX_BYTES cap)
    gc --older-than 30 [--family F] [--arch A]
                                   remove the entries matching the filters (then the cap if given)
    purge --family F | --arch A | --older-than DAYS | --version-not-current | --nvrtc-not-current
                                   remove matching entries (filters combine with AND);
    purge --all                    everything (asks on a terminal unless --yes)

--version-not-current matches entries built by another kernelgen version or another NVRTC
(old package/toolchain versions, removable in one command); --nvrtc-not-current only the latter.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from kernelgen import __version__
from kernelgen.core.cache import DiskCache, Entry
from kernelgen.core.jit import default_cache
from kernelgen.errors import CacheError

from . import UsageError, entries
from .table import err, human_bytes, print_json
from .values import parse_size


def _describe(e: Entry) -> str:
    return (f"{e.key[:12]}  {entries.family(e)} {entries.kind(e)}"
            f"({entries.fields_text(e.config_dict())}) {entries.arch(e)}")


def report(cache: DiskCache, removed: list[tuple[Entry, int]], dry_run: bool, json_out: bool,
           what: str) -> None:
    """Print what was (or would be) removed and the bytes freed."""
    freed = sum(n for _, n in removed)
    verb = "would remove" if dry_run else "removed"
    if json_out:
        print_json({"dry_run": dry_run, "removed": [{"key": e.key, "path": str(e.path), "bytes": n}
                                                    for e, n in removed],
                    "freed_bytes": freed, "remaining_bytes": cache.total_bytes()})
        return
    for e, n in removed:
        print(f"{verb}  {_describe(e)}  {human_bytes(n)}")
    print(f"{what}: {verb} {len(removed)} entries, {human_bytes(freed)}"
          f"{'' if dry_run else ' freed'}; writable layer holds {human_bytes(cache.total_bytes())}")


def remove(cache: DiskCache, victims: Iterable[Entry], dry_run: bool) -> list[tuple[Entry, int]]:
    """Remove entries of the writable layer; (entry, bytes) of those gone (all, on a dry run)."""
    out = []
    for e in victims:
        n = e.disk_bytes
        if not dry_run:
            try:
                cache.remove(e)
            except CacheError as why:  # permissions, a busy filesystem: named, the rest go on
                err(f"kernelgen: {why}")
                continue
        out.append((e, n))
    return out


def cmd_verify(args: argparse.Namespace) -> int:
    cache = default_cache()
    total = sum(1 for _ in cache.entries())
    bad = cache.verify(fix=args.fix)
    fixed = [args.fix and not e.readonly and not e.path.exists() for e, _ in bad]
    if args.json:
        print_json({"entries": total, "bad": [{"key": e.key, "path": str(e.path), "problem": p,
                                              "removed": f} for (e, p), f in zip(bad, fixed, strict=True)]})
    else:
        for (e, problem), f in zip(bad, fixed, strict=True):
            state = "removed" if f else ("BAD (read-only layer)" if e.readonly else "BAD")
            print(f"{state}  {e.key[:12]}  {problem}  ({e.path})")
        print(f"verify: {total} entries, {len(bad)} bad, {sum(fixed)} removed"
              + ("" if args.fix or not bad else "; run `kernelgen cache verify --fix` to remove them"))
    return 1 if len(bad) > sum(fixed) else 0


def cmd_gc(args: argparse.Namespace) -> int:
    cache = default_cache()
    flt = entries.make_filter(args, cache)
    removed, failed = [], 0
    if not flt.empty:
        victims = list(entries.select(cache, flt, include_readonly=False))
        removed = remove(cache, victims, args.dry_run)
        failed = len(victims) - len(removed)
    # No flags: enforce the configured cap (KERNELGEN_CACHE_MAX_BYTES; 0 means no cap).
    if args.max_bytes is not None or (flt.empty and cache.max_bytes > 0):
        cap = parse_size(args.max_bytes) if args.max_bytes is not None else cache.max_bytes
        sizes = {e.key: e.disk_bytes for e in cache.entries(include_readonly=False)}
        gone = {e.key for e, _ in removed}  # a dry run's filter step left them in place
        # the LRU entries over the cap, removed here so that each failure is named
        victims = [e for e in cache.gc(cap, dry_run=True) if e.key not in gone]
        evicted = remove(cache, victims, args.dry_run)
        failed += len(victims) - len(evicted)
        removed += evicted
        if not args.dry_run:  # stale build folders; past entries it could not remove, the next
            gone |= {e.key for e, _ in evicted}
            removed += [(e, sizes.get(e.key, 0)) for e in cache.gc(cap) if e.key not in gone]
    report(cache, removed, args.dry_run, args.json, "gc")
    return 1 if failed else 0  # some could not be removed


def cmd_purge(args: argparse.Namespace) -> int:
    cache = default_cache()
    stale = {}
    if args.version_not_current or args.nvrtc_not_current:
        from kernelgen.core.compile import nvrtc_version

        stale = {"stale_package": args.version_not_current, "stale_nvrtc": args.nvrtc_not_current,
                 "nvrtc_now": nvrtc_version(), "package_now": __version__}
    flt = entries.make_filter(args, cache, **stale)
    if flt.empty and not args.all:
        raise UsageError("purge: say what to remove (--family, --arch, --older-than, "
                         "--version-not-current, --nvrtc-not-current), or --all for every entry "
                         f"of {cache.root}")
    victims = list(entries.select(cache, flt, include_readonly=False))
    if flt.empty and victims and not args.yes and not args.dry_run and sys.stdin.isatty():
        answer = input(f"remove all {len(victims)} entries of {cache.root}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("purge: nothing removed", file=sys.stderr)
            return 1
    ro = sum(1 for e in entries.select(cache, flt) if e.readonly)
    if ro and not args.json:
        print(f"purge: {ro} matching entries are in read-only layers and stay", file=sys.stderr)
    removed = remove(cache, victims, args.dry_run)
    report(cache, removed, args.dry_run, args.json, "purge")
    return 1 if len(removed) < len(victims) else 0  # some could not be removed


def add_parsers(csub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = csub.add_parser("verify", help="check every entry's cubin against its manifest",
                        description=__doc__, formatter_class=fmt)
    p.add_argument("--fix", action="store_true", help="remove bad entries of the writable layer")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = csub.add_parser("gc", help="evict least recently used entries / remove by filter",
                        description=__doc__, formatter_class=fmt)
    p.add_argument("--max-bytes", metavar="SIZE", help="evict LRU entries until the layer fits (500M, 2G)")
    entries.add_filter_args(p)
    p.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    p = csub.add_parser("purge", help="remove entries by family/arch/age/version",
                        description=__doc__, formatter_class=fmt)
    entries.add_filter_args(p)
    p.add_argument("--version-not-current", action="store_true",
                   help="entries of another kernelgen version or another NVRTC")
    p.add_argument("--nvrtc-not-current", action="store_true", help="entries of another NVRTC")
    p.add_argument("--all", action="store_true", help="allow removing every entry (no filter)")
    p.add_argument("--yes", action="store_true", help="do not ask before --all on a terminal")
    p.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_purge)
