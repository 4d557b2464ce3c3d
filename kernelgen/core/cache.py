"""The on-disk kernel cache: keyed, verified, locked, atomically published, layered, size-capped.

Layout of one layer (see README "Cache layout"):

    <layer>/v1/<key[:2]>/<key>/kernel.cubin     the binary
                              /manifest.json    key parts, cubin sha256+size, symbols, log, times
                              /source.cu        rendered source (KERNELGEN_KEEP_SOURCE=1)
    <layer>/v1/locks/<key>.lock                 one filelock per key (writable layer only)
    <layer>/v1/tmp/                             private build folders, renamed into place

The key is sha256 of the canonical JSON of `manifest_parts()`: it names everything that can change
the binary and nothing that depends on where the cache lives, so a moved cache still hits.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock

from .. import knobs
from .._version import __version__
from ..errors import CacheError, CacheLockTimeout
from .config import KernelConfig
from .render import Rendered

SCHEMA_VERSION = 1
_CORRUPT = object()  # DiskCache._verified's "files do not match the manifest"
_LAYOUT = f"v{SCHEMA_VERSION}"
CUBIN = "kernel.cubin"
MANIFEST = "manifest.json"
SOURCE = "source.cu"


def manifest_parts(config: KernelConfig, rendered: Rendered, nvrtc: str, options: list[str],
                   toolkit_headers: str = "") -> dict:
    """Everything the binary depends on. Stable across machines and cache locations."""
    return {
        "schema": SCHEMA_VERSION,
        "package_version": __version__,
        "family": config.family,
        "config": config.as_dict(),
        "arch": config.arch,
        "source_sha256": rendered.source_digest(),
        "headers": rendered.header_digests(),
        "nvrtc": nvrtc,
        "toolkit_headers": toolkit_headers,
        "options": list(options),
    }


def key_of(parts: dict) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


# manifest fields the cache and its tools read: (types, what that is, may be absent); another
# value makes the entry damaged, as an unreadable manifest does
_MANIFEST_FIELDS: dict[str, tuple[tuple[type, ...], str, bool]] = {
    "parts": ((dict,), "an object", False),
    "cubin_size": ((int,), "an integer", False),
    "cubin_sha256": ((str,), "a string", False),
    "compile_log": ((str,), "a string", True),
    "compile_seconds": ((int, float), "a number", True),
    "created": ((int, float), "a number", True),
}


def _manifest_problem(manifest: object) -> str:
    """'' if `manifest` has the shape the cache writes, else what is wrong with it."""
    if not isinstance(manifest, dict):
        return "manifest is not a JSON object"
    for name, (types, what, optional) in _MANIFEST_FIELDS.items():
        value = manifest.get(name)
        if not ((value is None and optional) or (isinstance(value, types) and not isinstance(value, bool))):
            return f"manifest field {name!r} is {json.dumps(value)}, expected {what}"
    if not isinstance(manifest["parts"].get("config"), dict):
        return "manifest field 'parts' has no 'config' object"
    return ""


@dataclass
class Entry:
    key: str
    path: Path  # the entry folder
    manifest: dict  # {} when damaged
    readonly: bool
    problem: str = ""  # why the manifest is unusable (the entry is damaged), '' if it is not

    @property
    def cubin_path(self) -> Path:
        return self.path / CUBIN

    @property
    def size(self) -> int:
        return int(self.manifest.get("cubin_size", 0))

    @property
    def last_used(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0

    def config_dict(self) -> dict:
        return self.manifest.get("parts", {}).get("config", {})

    @property
    def disk_bytes(self) -> int:
        """Bytes of every file in the entry folder: what removing it frees."""
        return _dir_bytes(self.path)


class DiskCache:
    """One writable layer (may turn out unwritable) behind zero or more read-only layers."""

    def __init__(
        self,
        root: Path | str | None = None,
        readonly: list[Path] | None = None,
        max_bytes: int | None = None,
    ):
        self.root = Path(root) if root is not None else knobs.cache_dir()
        self.readonly_roots = [Path(p) for p in (readonly if readonly is not None else knobs.readonly_cache_dirs())]
        self.max_bytes = knobs.cache_max_bytes() if max_bytes is None else max_bytes
        self._writable: bool | None = None
        # why the last entry built here could not be stored ('' once one is): the unwritable
        # probe's or the failed publish's error, for callers that must report it (prewarm)
        self.write_error = ""
        self._warned: set[str] = set()
        self._touched: set[str] = set()
        self._since_gc = 15  # the first publish of a process checks the cap, then every 16th

    # -- layout ------------------------------------------------------------------------------
    @staticmethod
    def _base(root: Path) -> Path:
        return root / _LAYOUT

    def entry_path(self, key: str, root: Path | None = None) -> Path:
        return self._base(root or self.root) / key[:2] / key

    def lock_path(self, key: str) -> Path:
        return self._base(self.root) / "locks" / f"{key}.lock"

    @property
    def tmp_dir(self) -> Path:
        """Private work folders of the writable layer: same filesystem, so a rename publishes."""
        return self._base(self.root) / "tmp"

    def layers(self) -> list[tuple[Path, bool]]:
        """(root, readonly) in lookup order: read-only layers first, the writable one last."""
        return [(p, True) for p in self.readonly_roots] + [(self.root, False)]

    # -- writability -------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        if self._writable is None:
            try:
                base = self._base(self.root)
                for sub in ("tmp", "locks"):
                    (base / sub).mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=base / "tmp", prefix="probe-"):
                    pass
                self._writable = True
            except OSError as e:
                self._writable = False
                self.write_error = f"cache directory {self.root} is not writable ({e})"
                self._warn(f"cache directory {self.root} is not writable ({e}); kernels will be "
                           f"compiled and kept in memory only. Set KERNELGEN_CACHE_DIR to a "
                           f"writable folder to keep them across runs.", "unwritable")
        return self._writable

    def _warn(self, msg: str, kind: str) -> None:
        """Warn once per kind of trouble (unwritable, write failed, corrupt read-only entry)."""
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"kernelgen: {msg}", RuntimeWarning, stacklevel=3)

    # -- read --------------------------------------------------------------------------------
    def _read_entry(self, path: Path, readonly: bool) -> Entry:
        """The entry of a folder; damaged (empty manifest, `problem` says why) if its manifest is
        unreadable or valid JSON of another shape, which verify reports and --fix removes."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError):
            return Entry(path.name, path, {}, readonly, "manifest missing or unreadable")
        problem = _manifest_problem(manifest)
        return Entry(path.name, path, {} if problem else manifest, readonly, problem)

    def load(self, key: str, *, peek: bool = False) -> tuple[Entry, bytes] | None:
        """Find `key` in the layers, verify size and sha256, return the entry and the cubin.

        A corrupt or partial entry in the writable layer is removed (and so rebuilt by the
        caller); one in a read-only layer is skipped with a warning. `peek`: change nothing
        (no last-used update, no removal) — for `explain` and `prewarm --check`.
        """
        for root, ro in self.layers():
            path = self.entry_path(key, root)
            if not path.is_dir():
                continue
            found = self._verified(path, ro)
            if found is None:  # transient read error (EMFILE, EIO): neither use nor delete
                continue
            if found is _CORRUPT:
                if ro:
                    self._warn(f"corrupt entry {path} in read-only layer skipped", "ro-corrupt")
                elif not peek:
                    self._discard(path)
                continue
            entry, cubin = found
            if not ro and not peek and key not in self._touched:
                self._touched.add(key)
                try:  # last-used time for LRU eviction: the folder's mtime, once per process
                    os.utime(path)
                except OSError:
                    pass
            return entry, cubin
        return None

    def _verified(self, path: Path, readonly: bool):
        """(entry, cubin) if the entry's files match its manifest, _CORRUPT if they do not (or
        are missing: a partial entry), None on a transient read error."""
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            cubin = (path / CUBIN).read_bytes()
        except (FileNotFoundError, ValueError):
            return _CORRUPT
        except OSError:
            return None
        if (
            _manifest_problem(manifest)
            or len(cubin) != manifest.get("cubin_size")
            or hashlib.sha256(cubin).hexdigest() != manifest.get("cubin_sha256")
        ):
            return _CORRUPT
        return Entry(path.name, path, manifest, readonly), cubin

    def _discard(self, path: Path) -> str:
        """Remove an entry folder: rename aside first so no reader sees half of it. Returns ''
        once it is gone, else why it is not (a read-only folder, a busy filesystem)."""
        trash = self._base(self.root) / "tmp" / f"trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)  # a layer unpacked by hand has no tmp/
            os.rename(path, trash)
        except OSError as e:
            return "" if not path.exists() else str(e)  # gone already: another process took it
        shutil.rmtree(trash, ignore_errors=True)
        return ""

    # -- write -------------------------------------------------------------------------------
    def publish(self, key: str, parts: dict, cubin: bytes, *, symbols: list[str], log: str,
                seconds: float, source: str | None) -> Entry | None:
        """Write into a private temp folder, fsync, rename into place. None if not writable."""
        if not self.writable:
            return None
        final = self.entry_path(key)
        now = time.time()
        manifest = {
            "key": key,
            "parts": parts,
            "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
            "cubin_size": len(cubin),
            "symbols": symbols,
            "compile_seconds": round(seconds, 4),
            "created": now,
            "compile_log": log.strip(),
            "python": sys.version.split()[0],
        }
        tmp = None
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)  # the cache dir may have been wiped
            tmp = Path(tempfile.mkdtemp(prefix=f"{key[:12]}-", dir=self.tmp_dir))
            _write_synced(tmp / CUBIN, cubin)
            if source is not None and knobs.keep_source():
                _write_synced(tmp / SOURCE, source.encode())
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
            _fsync_dir(tmp)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
                tmp = None
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # Lost a race to another writer of the same key: theirs is as good as ours.
            _fsync_dir(final.parent)
        except OSError as e:
            self.write_error = f"could not write to cache {self.root} ({e})"
            self._warn(f"{self.write_error}; continuing from memory", "write")
            return None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        self.write_error = ""
        self._since_gc += 1
        if self.max_bytes > 0 and self._since_gc >= 16:
            self._since_gc = 0
            self.gc(self.max_bytes)
        return Entry(key, final, manifest, False)

    def get_or_build(
        self, key: str, build: Callable[[], tuple[bytes, dict]], describe: str = ""
    ) -> tuple[Entry | None, bytes, bool]:
        """Double-checked: look, lock, look again, build + publish. Returns (entry, cubin, built).

        `build()` returns (cubin, publish kwargs). N processes asking at once build once.
        """
        hit = self.load(key)
        if hit is not None:
            return hit[0], hit[1], False
        if not self.writable:
            cubin, meta = build()
            return None, cubin, True
        lock = filelock.FileLock(str(self.lock_path(key)), timeout=knobs.lock_timeout())
        try:
            with lock:
                hit = self.load(key)
                if hit is not None:
                    return hit[0], hit[1], False
                cubin, meta = build()
                entry = self.publish(key, cubin=cubin, **meta)
                return entry, cubin, True
        except filelock.Timeout:
            raise CacheLockTimeout(
                f"waited {knobs.lock_timeout():.0f}s for {self.lock_path(key)}, held by another "
                f"process compiling {describe or key}. If no kernelgen process is alive the lock "
                f"is on a filesystem without working flock (NFS?): point KERNELGEN_CACHE_DIR at "
                f"local disk, or raise KERNELGEN_LOCK_TIMEOUT for very slow compiles."
            ) from None

    # -- enumerate / maintain ----------------------------------------------------------------
    def entries(self, include_readonly: bool = True) -> Iterator[Entry]:
        for root, ro in self.layers():
            if ro and not include_readonly:
                continue
            base = self._base(root)
            if not base.is_dir():
                continue
            for fan in sorted(base.iterdir()):
                if len(fan.name) != 2 or not fan.is_dir():
                    continue
                for path in sorted(fan.iterdir()):
                    yield self._read_entry(path, ro)

    def remove(self, entry: Entry) -> None:
        if entry.readonly:
            raise CacheError(f"{entry.path} is in a read-only layer")
        why = self._discard(entry.path)
        if why:
            raise CacheError(f"could not remove {entry.path} ({why})")

    def verify(self, fix: bool = False) -> list[tuple[Entry, str]]:
        """(entry, problem) for every entry whose files do not match its manifest."""
        bad = []
        for entry in self.entries():
            problem = _check_entry(entry)
            if problem:
                bad.append((entry, problem))
                if fix and not entry.readonly:
                    self._discard(entry.path)
        return bad

    def total_bytes(self) -> int:
        return sum(_dir_bytes(e.path) for e in self.entries(include_readonly=False))

    def gc(self, max_bytes: int, dry_run: bool = False) -> list[Entry]:
        """Evict least-recently-used entries of the writable layer until it fits `max_bytes`.

        Returns the entries removed (`dry_run`: only return what would be evicted); one that
        cannot be removed stays, and the next least recently used is tried.
        """
        entries = [(e, _dir_bytes(e.path)) for e in self.entries(include_readonly=False)]
        total = sum(s for _, s in entries)
        removed = []
        for entry, size in sorted(entries, key=lambda es: es[0].last_used):
            if total <= max_bytes:
                break
            if not dry_run and self._discard(entry.path):
                continue
            total -= size
            removed.append(entry)
        if not dry_run:
            self._clean_stale()
        return removed

    def _clean_stale(self, older_than: float = 3600.0) -> None:
        """Drop build folders left by dead processes (older than `older_than` seconds)."""
        base = self._base(self.root)
        now = time.time()
        for p in (base / "tmp").glob("*"):
            try:
                if now - p.stat().st_mtime > older_than:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass
        # Lock files (0 bytes) are never deleted: removing one that a live process holds would
        # let another process lock a fresh inode and compile the same kernel concurrently.


def _check_entry(entry: Entry) -> str:
    if entry.problem or not entry.manifest:
        return entry.problem or "manifest missing or unreadable"
    try:
        data = entry.cubin_path.read_bytes()
    except OSError:
        return "cubin missing"
    if len(data) != entry.size:
        return f"cubin is {len(data)} B, manifest says {entry.size} B"
    if hashlib.sha256(data).hexdigest() != entry.manifest.get("cubin_sha256"):
        return "cubin sha256 differs from the manifest"
    if key_of(entry.manifest.get("parts", {})) != entry.key:
        return "folder name is not the key of the manifest's parts"
    return ""


def _dir_bytes(path: Path) -> int:
    try:
        return sum(f.stat().st_size for f in path.iterdir())
    except OSError:
        return 0


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def describe_miss(cache: DiskCache, parts: dict) -> list[str]:
    """Why `parts` misses: compare with entries of the same config that do exist."""
    key = key_of(parts)
    if cache.load(key, peek=True) is not None:
        return [f"hit: {key}"]
    reasons = []
    want = parts["config"]
    same_cfg = [e for e in cache.entries() if e.config_dict() == want]
    if not same_cfg:
        arch = want.get("arch")
        no_arch = {k: v for k, v in want.items() if k != "arch"}
        others = sorted({e.config_dict().get("arch") for e in cache.entries()
                         if {k: v for k, v in e.config_dict().items() if k != "arch"} == no_arch} - {arch})
        if others:  # e.g. prewarmed for sm_120a, running on GB10 (sm_121a)
            return [f"miss: this config is cached for {', '.join(map(str, others))} only, not {arch} (a "
                    f"cubin of one target does not run on another's part); run `kernelgen prewarm "
                    f"--arch {arch}`"]
        same_fam = sum(1 for e in cache.entries() if e.manifest.get("parts", {}).get("family") == parts["family"])
        return [f"miss: no entry for this config in any layer ({same_fam} entries of family "
                f"{parts['family']!r} exist); run `kernelgen prewarm --arch {arch}` for it"]
    for e in same_cfg:
        other = e.manifest.get("parts", {})
        diffs = []
        for field in sorted(set(parts) | set(other)):
            a, b = parts.get(field), other.get(field)
            if a == b:
                continue
            if field == "headers":
                for h in sorted(set(a or {}) | set(b or {})):
                    if (a or {}).get(h) != (b or {}).get(h):
                        diffs.append(f"header {h} changed")
            else:
                diffs.append(f"{field}: wanted {a!r}, entry has {b!r}")
        if not diffs:  # the same parts under another name: a folder renamed by hand
            diffs.append("nothing in its key parts; its folder name is not its key "
                         "(`kernelgen cache verify`)")
        reasons.append(f"entry {e.key[:16]} ({'read-only' if e.readonly else 'writable'}) differs: "
                       + "; ".join(diffs))
    return ["miss: " + key] + reasons
