"""`kernelgen cache export | import`: move cache entries between machines as a .tar.gz.

The archive holds entry folders with paths relative to a layer root (`v1/ab/<key>/kernel.cubin`,
`manifest.json`, `source.cu`), so it can also be unpacked by hand as a read-only layer.

Import trusts nothing in the archive: members must be plain files at `v<schema>/<xx>/<key>/<name>`
(no absolute paths, no `..`, no links); they are written into a private folder inside the
writable layer, every entry is verified there (cubin size and sha256 against its manifest, and
the folder name must be the key of the manifest's parts), and each good one is published with
one atomic rename. Keys already present in any layer are skipped. Exit 1 if anything was rejected.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path

from kernelgen.core.cache import CUBIN, MANIFEST, SCHEMA_VERSION, SOURCE, DiskCache
from kernelgen.core.jit import default_cache
from kernelgen.errors import CacheError

from . import UsageError, entries
from .table import err, human_bytes, print_json

_FILES = "|".join(re.escape(n) for n in (CUBIN, MANIFEST, SOURCE))
_KEY = re.compile(r"^[0-9a-f]{64}$")
_MEMBER = re.compile(rf"^v(?P<schema>\d+)/(?P<fan>[0-9a-f]{{2}})/(?P<key>[0-9a-f]{{64}})/(?:{_FILES})$")
MAX_MEMBER_BYTES = 1 << 30  # a cubin is KBs to MBs; anything near this is not ours


# -- export -----------------------------------------------------------------------------------
def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """No owner names or ids from this machine; plain read-write file mode."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o644
    return info


def cmd_export(args: argparse.Namespace) -> int:
    cache = default_cache()
    flt = entries.make_filter(args, cache)
    chosen, seen = [], set()
    for e in entries.select(cache, flt):  # lookup order: a key in several layers goes once
        if e.manifest and e.key not in seen:
            seen.add(e.key)
            chosen.append(e)
    out = Path(args.archive)
    if not chosen:  # an empty archive would replace a good one of the same name
        err(f"export: no entry matches; {out} not written")
        return 1
    tmp = out.with_name(out.name + f".{os.getpid()}.part")
    size = 0
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for e in chosen:
                root = e.path.parents[2]  # <root>/v1/<fan>/<key>
                for f in sorted(e.path.iterdir()):
                    if f.is_file() and not f.is_symlink():
                        tar.add(f, arcname=f.relative_to(root).as_posix(), recursive=False,
                                filter=_normalize)
                        size += f.stat().st_size
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CacheError(f"export to {out}: {e.strerror or e}") from None
    if args.json:
        print_json({"archive": str(out), "entries": [e.key for e in chosen], "bytes": size})
    else:
        print(f"export: {len(chosen)} entries ({human_bytes(size)}) to {out}")
    return 0


# -- import -----------------------------------------------------------------------------------
def _name(m: tarfile.TarInfo) -> str:
    """The member's path without a leading './' (as `tar -C root -czf a.tgz ./v1` writes)."""
    return m.name[2:] if m.name.startswith("./") else m.name


def _member_problem(m: tarfile.TarInfo) -> str:
    name = _name(m)
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in Path(name).parts:
        return "'..' in path"
    if m.issym() or m.islnk():
        return "link"
    if not m.isreg():
        return "not a regular file"
    if m.size > MAX_MEMBER_BYTES:
        return f"{m.size} B is too large for a cache file"
    match = _MEMBER.match(name)
    if not match:
        return f"not a cache entry file (expected v{SCHEMA_VERSION}/<xx>/<key>/{{{CUBIN},{MANIFEST},{SOURCE}}})"
    if int(match["schema"]) != SCHEMA_VERSION:
        return f"cache schema v{match['schema']}; this kernelgen reads v{SCHEMA_VERSION}"
    if match["fan"] != match["key"][:2]:
        return "fan-out folder does not match the key"
    return ""


def unpack(archive: Path, dest: Path) -> list[tuple[str, str]]:
    """Write the archive's valid entry files under `dest` (a layer root); return (member,
    problem) for every member refused. A key with a refused member is dropped whole."""
    refused: list[tuple[str, str]] = []
    tainted: set[str] = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar:
                if m.isdir():
                    continue
                problem = _member_problem(m)
                parts = _name(m).split("/")
                if problem:
                    refused.append((m.name, problem))
                    if len(parts) > 3 and _KEY.match(parts[2]):  # only a well-formed key folder
                        tainted.add(parts[2])
                    continue
                src = tar.extractfile(m)
                if src is None:
                    refused.append((m.name, "unreadable member"))
                    continue
                target = dest.joinpath(*parts)  # parts matched _MEMBER: no '..', no root
                target.parent.mkdir(parents=True, exist_ok=True)
                with src, open(target, "wb") as f:
                    shutil.copyfileobj(src, f)
    except FileNotFoundError:
        raise UsageError(f"{archive}: no such file") from None
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise UsageError(f"{archive}: not a readable .tar.gz ({e})") from None
    for key in tainted:
        shutil.rmtree(dest / f"v{SCHEMA_VERSION}" / key[:2] / key, ignore_errors=True)
    return refused


def _present(cache: DiskCache, key: str) -> bool:
    return any(cache.entry_path(key, root).is_dir() for root, _ in cache.layers())


def import_archive(cache: DiskCache, archive: Path) -> dict[str, list]:
    """Unpack, verify and publish. Returns {"imported": keys, "skipped": keys, "rejected": [(what, why)]}."""
    with warnings.catch_warnings():  # the error below says it better than the probe's warning
        warnings.simplefilter("ignore")
        writable = cache.writable
    if not writable:
        raise CacheError(f"cannot import: cache directory {cache.root} is not writable "
                         f"(set KERNELGEN_CACHE_DIR to a writable folder)")
    work = Path(tempfile.mkdtemp(prefix="import-", dir=cache.tmp_dir))
    try:
        rejected = unpack(archive, work)
        staged = DiskCache(work, readonly=[], max_bytes=0)
        bad = {e.key: problem for e, problem in staged.verify()}
        rejected += [(key, problem) for key, problem in sorted(bad.items())]
        imported, skipped = [], []
        for e in staged.entries():
            if e.key in bad:
                continue
            final = cache.entry_path(e.key)
            if _present(cache, e.key):
                skipped.append(e.key)
                continue
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(e.path, final)
                os.utime(final)  # imported now: the newest for LRU eviction
                imported.append(e.key)
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                skipped.append(e.key)  # another process published it meanwhile
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"imported": imported, "skipped": skipped, "rejected": rejected}


def cmd_import(args: argparse.Namespace) -> int:
    res = import_archive(default_cache(), Path(args.archive))
    if args.json:
        print_json(res)
    else:
        for key in res["imported"]:
            print(f"imported  {key[:12]}")
        for key in res["skipped"]:
            print(f"skipped   {key[:12]} (already in the cache)")
        for what, why in res["rejected"]:
            print(f"rejected  {what}: {why}")
        print(f"import: {len(res['imported'])} imported, {len(res['skipped'])} skipped, "
              f"{len(res['rejected'])} rejected")
    return 1 if res["rejected"] else 0


def add_parsers(csub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = csub.add_parser("export", help="write entries to a .tar.gz", description=__doc__, formatter_class=fmt)
    p.add_argument("archive", metavar="ARCHIVE.tar.gz")
    entries.add_filter_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)

    p = csub.add_parser("import", help="verify and add the entries of a .tar.gz", description=__doc__,
                        formatter_class=fmt)
    p.add_argument("archive", metavar="ARCHIVE.tar.gz")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_import)
