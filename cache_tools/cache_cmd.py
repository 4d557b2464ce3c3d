"""`kernelgen cache ...`: inspect and maintain the kernel cache.

The cache is `kernelgen.core.jit.default_cache()`: read-only layers (KERNELGEN_CACHE_RO) first,
the writable layer (KERNELGEN_CACHE_DIR) last. Commands that remove or add entries touch only the
writable layer.

    ls       one line per entry (key prefix, config, arch, cubin size, registers/spills, ...)
    info     layers, sizes, size cap, counts per family/arch; `info KEY` = `show KEY`
    show     one entry's manifest and compile log, by key prefix (4+ characters)
    explain  why a config would miss (or that it hits), without compiling
    verify   entries whose files do not match their manifest (--fix removes them)
    gc       evict least-recently-used entries down to a size; or remove by filter
    purge    remove entries by family/arch/age/stale version (--all for everything)
    export   write entries to a .tar.gz;  import: verify and add one
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from kernelgen import __version__, knobs
from kernelgen.core.cache import DiskCache, Entry
from kernelgen.core.jit import default_cache

from . import archive, cleanup, entries, explain
from .table import format_table, human_bytes, print_json


def nvrtc_text() -> str:
    try:
        from kernelgen.core.compile import nvrtc_version

        return nvrtc_version()
    except Exception as e:  # no libnvrtc: info still works
        return f"unavailable ({e})"


def layer_info(cache: DiskCache) -> list[dict[str, Any]]:
    """Per layer in lookup order: path, read-only, usable for writing, entries, bytes."""
    per_root: dict[Path, list[Entry]] = {}
    for e in cache.entries():
        per_root.setdefault(e.path.parents[2], []).append(e)  # <root>/v1/<fan>/<key>
    out = []
    for root, ro in cache.layers():
        es = per_root.get(root, [])
        if ro:
            writable = False
        elif not root.exists():  # the probe would create it (a typo in KERNELGEN_CACHE_DIR)
            writable = _creatable(root)
        else:
            with warnings.catch_warnings():  # the probe warns; here it is the answer, not news
                warnings.simplefilter("ignore")
                writable = cache.writable
        out.append({"path": str(root), "readonly": ro, "exists": root.is_dir(), "writable": writable,
                    "entries": len(es), "bytes": sum(e.disk_bytes for e in es)})
    return out


def _creatable(path: Path) -> bool:
    """Could the first build create `path`? Its nearest existing ancestor is a writable folder."""
    parent = next((p for p in path.parents if p.exists()), None)
    return parent is not None and parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def cmd_ls(args: argparse.Namespace) -> int:
    cache = default_cache()
    flt = entries.make_filter(args, cache)
    rows = sorted((entries.row(e) for e in entries.select(cache, flt)),
                  key=lambda r: (r["family"], r["kind"], r["arch"], entries.fields_text(r["config"])))
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no entries" + ("" if flt.empty else " match the filters"), file=sys.stderr)
        return 0
    now = time.time()
    print(format_table(entries.TABLE_HEADERS, [entries.table_row(r, now) for r in rows],
                       right=entries.TABLE_RIGHT))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    if args.key:
        return cmd_show(args)
    cache = default_cache()
    counts: Counter[tuple[str, str]] = Counter()
    sizes: Counter[tuple[str, str]] = Counter()
    for e in cache.entries():
        if not e.problem:
            counts[entries.family(e), entries.arch(e)] += 1
            sizes[entries.family(e), entries.arch(e)] += e.size
    entries.note_damaged(cache)
    info = {
        "package_version": __version__,
        "nvrtc": nvrtc_text(),
        "layers": layer_info(cache),
        "max_bytes": knobs.cache_max_bytes(),
        "by_family_arch": [{"family": f, "arch": a, "entries": n, "cubin_bytes": sizes[f, a]}
                           for (f, a), n in sorted(counts.items())],
    }
    if args.json:
        print_json(info)
        return 0
    print(f"kernelgen {info['package_version']}, NVRTC {info['nvrtc']}")
    print("\nlayers, in lookup order:")
    print(format_table(
        ("PATH", "LAYER", "WRITABLE", "ENTRIES", "SIZE"),
        [(la["path"], "read-only" if la["readonly"] else "writable",
          ("yes" if la["writable"] else ("-" if la["readonly"] else "NO"))
          + ("" if la["exists"] else " (absent)"), la["entries"],
          human_bytes(la["bytes"])) for la in info["layers"]],
        right=("ENTRIES", "SIZE")))
    print(f"\nsize cap of the writable layer: {human_bytes(info['max_bytes'])} "
          f"(KERNELGEN_CACHE_MAX_BYTES; least recently used entries are evicted above it)")
    if info["by_family_arch"]:
        print("\nentries by family and arch:")
        print(format_table(("FAMILY", "ARCH", "ENTRIES", "CUBINS"),
                           [(r["family"], r["arch"], r["entries"], human_bytes(r["cubin_bytes"]))
                            for r in info["by_family_arch"]], right=("ENTRIES", "CUBINS")))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    e = entries.by_prefix(default_cache(), args.key)
    if args.json:
        print_json({"key": e.key, "path": str(e.path), "layer": entries.layer(e),
                    "disk_bytes": e.disk_bytes, "last_used": e.last_used, "manifest": e.manifest})
        return 0
    manifest = dict(e.manifest)
    log = manifest.pop("compile_log", "")
    print(f"key:    {e.key}\npath:   {e.path}\nlayer:  {'read-only' if e.readonly else 'writable'}")
    inner = ", ".join(f"{k}={v}" for k, v in e.config_dict().items() if k not in ("family", "kind"))
    print(f"config: {entries.kind(e)}({inner})")
    print("manifest:")
    print(json.dumps(manifest, indent=2, sort_keys=True))
    if log:
        print("compile log:")
        print("\n".join("  " + line for line in log.splitlines()))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="inspect and maintain the kernel cache", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = p.add_subparsers(dest="cache_cmd", metavar="SUBCOMMAND", required=True)

    q = csub.add_parser("ls", help="list entries")
    entries.add_filter_args(q)
    q.add_argument("--json", action="store_true", help="a JSON list of entries on stdout")
    q.set_defaults(func=cmd_ls)

    q = csub.add_parser("info", help="layers, sizes, size cap, counts (info KEY: one entry)")
    q.add_argument("key", nargs="?", metavar="KEY_PREFIX", help="show this entry instead")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_info)

    q = csub.add_parser("show", help="one entry's manifest and compile log")
    q.add_argument("key", metavar="KEY_PREFIX", help="4 or more leading characters of the key")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_show)

    explain.add_parser(csub)
    cleanup.add_parsers(csub)
    archive.add_parsers(csub)
