"""The disk cache without a GPU: publish, verify-on-load, layers, unwritable/full disk, LRU, strict.

Every test gets a fresh empty cache (`cache_env`); E4M4 and kbit configs are the test kernels.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
import warnings
from pathlib import Path

import pytest

from kernelgen.core import cache as cache_mod
from kernelgen.core import jit
from kernelgen.core.cache import CUBIN, MANIFEST, SOURCE, DiskCache, describe_miss, key_of
from kernelgen.core.jit import build, default_cache, key_parts
from kernelgen.errors import CacheError, JitDisabledError
from kernelgen.kbit.config import E4M4Config, KbitQuantizeConfig, KbitRepackConfig

E4M4 = E4M4Config(arch="sm_90a")
CONFIGS = [
    E4M4Config(arch="sm_90a"),
    E4M4Config(arch="sm_80"),
    E4M4Config(arch="sm_100a"),
    E4M4Config(arch="sm_120a"),
]


def entry_dirs(root: Path) -> list[Path]:
    """Every entry folder of a layer (two-level fan-out)."""
    base = root / "v1"
    if not base.is_dir():
        return []
    return sorted(p for fan in base.iterdir() if len(fan.name) == 2 for p in fan.iterdir())


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def assert_valid_entry(path: Path, key: str, cubin: bytes, what: str) -> dict:
    assert path.name == key and path.parent.name == key[:2], f"{what}: entry at {path}"
    assert {p.name for p in path.iterdir()} >= {CUBIN, MANIFEST}, f"{what}: {list(path.iterdir())}"
    manifest = json.loads((path / MANIFEST).read_text())
    data = (path / CUBIN).read_bytes()
    assert data == cubin, f"{what}: cubin on disk differs from the one returned"
    assert manifest["cubin_size"] == len(data), what
    assert manifest["cubin_sha256"] == hashlib.sha256(data).hexdigest(), what
    assert manifest["key"] == key == key_of(manifest["parts"]), what
    return manifest


# -- publish ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [E4M4, KbitQuantizeConfig(arch="sm_80", bits=2)],
                         ids=lambda c: c.short())
def test_publish_is_complete_and_atomic(cfg, cache_env):
    res = build(cfg)
    assert res.compiled and res.cubin.startswith(b"\x7fELF"), cfg
    assert res.key == key_of(key_parts(cfg)[0])
    [path] = entry_dirs(cache_env)
    assert res.entry.path == path
    manifest = assert_valid_entry(path, res.key, res.cubin, cfg.short())
    assert {p.name for p in path.iterdir()} == {CUBIN, MANIFEST, SOURCE}, cfg
    assert (path / SOURCE).read_text() == jit.render(cfg).source
    assert manifest["symbols"] == list(cfg.symbols())
    assert manifest["parts"]["config"] == cfg.as_dict()
    assert "Used" in manifest["compile_log"], "ptxas report not kept"
    assert list((cache_env / "v1" / "tmp").iterdir()) == [], "build folder left behind"
    assert default_cache().verify() == []
    # and it hits, with the same bytes
    again = build(cfg)
    assert again.compiled is False and again.cubin == res.cubin, cfg


def test_keep_source_off(cache_env, monkeypatch):
    monkeypatch.setenv("KERNELGEN_KEEP_SOURCE", "0")
    res = build(E4M4)
    assert {p.name for p in res.entry.path.iterdir()} == {CUBIN, MANIFEST}


def test_publish_lost_race_keeps_first(cache_env):
    """A second publish of the same key (a writer that lost the race) changes nothing."""
    res = build(E4M4)
    cache = default_cache()
    before = (res.entry.path / MANIFEST).read_bytes()
    parts = key_parts(E4M4)[0]
    cache.publish(res.key, parts, b"\x7fELF-other", symbols=[], log="", seconds=0.0, source=None)
    assert (res.entry.path / MANIFEST).read_bytes() == before
    assert (res.entry.path / CUBIN).read_bytes() == res.cubin
    assert list((cache_env / "v1" / "tmp").iterdir()) == []


# -- verify on load -----------------------------------------------------------------------------

def _flip_byte(p: Path) -> None:
    data = bytearray((p / CUBIN).read_bytes())
    data[len(data) // 2] ^= 0x01
    (p / CUBIN).write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    data = (p / CUBIN).read_bytes()
    (p / CUBIN).write_bytes(data[: len(data) // 3])


def _empty_cubin(p: Path) -> None:
    (p / CUBIN).write_bytes(b"")


def _extend(p: Path) -> None:
    with open(p / CUBIN, "ab") as f:
        f.write(b"\0")


def _delete_cubin(p: Path) -> None:
    (p / CUBIN).unlink()


def _delete_manifest(p: Path) -> None:
    (p / MANIFEST).unlink()


def _truncate_manifest(p: Path) -> None:
    text = (p / MANIFEST).read_text()
    (p / MANIFEST).write_text(text[: len(text) // 2])


def _manifest_not_an_object(p: Path) -> None:
    (p / MANIFEST).write_text("[]")


def _manifest_wrong_sha(p: Path) -> None:
    m = json.loads((p / MANIFEST).read_text())
    m["cubin_sha256"] = "0" * 64
    (p / MANIFEST).write_text(json.dumps(m))


def _manifest_wrong_size(p: Path) -> None:
    m = json.loads((p / MANIFEST).read_text())
    m["cubin_size"] += 1
    (p / MANIFEST).write_text(json.dumps(m))


def _manifest_parts_not_an_object(p: Path) -> None:
    m = json.loads((p / MANIFEST).read_text())
    m["parts"] = "x"
    (p / MANIFEST).write_text(json.dumps(m))


def _manifest_size_not_a_number(p: Path) -> None:
    m = json.loads((p / MANIFEST).read_text())
    m["cubin_size"] = str(m["cubin_size"])
    (p / MANIFEST).write_text(json.dumps(m))


def _only_cubin(p: Path) -> None:
    """A half-written entry: the folder exists with the binary and nothing else."""
    for f in p.iterdir():
        if f.name != CUBIN:
            f.unlink()


CORRUPTIONS = [_flip_byte, _truncate, _empty_cubin, _extend, _delete_cubin, _delete_manifest,
               _truncate_manifest, _manifest_not_an_object, _manifest_wrong_sha, _manifest_wrong_size,
               _manifest_parts_not_an_object, _manifest_size_not_a_number, _only_cubin]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_corrupt_entry_is_rebuilt(corrupt, cache_env):
    good = build(E4M4)
    corrupt(good.entry.path)
    cache = DiskCache()  # a new process: nothing remembered
    assert cache.load(good.key) is None, f"{corrupt.__name__}: corrupt entry was loaded"
    res = build(E4M4)
    assert res.compiled is True, f"{corrupt.__name__}: corrupt entry was not rebuilt"
    assert res.cubin == good.cubin, f"{corrupt.__name__}: rebuilt cubin differs"
    assert_valid_entry(res.entry.path, res.key, res.cubin, corrupt.__name__)
    assert default_cache().verify() == [], corrupt.__name__
    assert list((cache_env / "v1" / "tmp").iterdir()) == [], f"{corrupt.__name__}: trash left"
    assert build(E4M4).compiled is False, corrupt.__name__


def test_half_written_entry_before_first_build(cache_env):
    """An entry folder that a killed writer left with a partial cubin and no manifest."""
    parts = key_parts(E4M4)[0]
    path = cache_env / "v1" / key_of(parts)[:2] / key_of(parts)
    path.mkdir(parents=True)
    (path / CUBIN).write_bytes(b"\x7fELF\x02\x01")
    res = build(E4M4)
    assert res.compiled is True and len(res.cubin) > 6
    assert_valid_entry(path, res.key, res.cubin, "half-written")


@pytest.mark.parametrize("corrupt", [_flip_byte, _delete_manifest, _only_cubin,
                                     _manifest_parts_not_an_object, _manifest_size_not_a_number],
                         ids=lambda f: f.__name__.strip("_"))
def test_verify_reports_and_fixes(corrupt, cache_env):
    good = build(E4M4)
    other = build(CONFIGS[1])
    corrupt(good.entry.path)
    cache = DiskCache()
    bad = cache.verify()
    assert [e.key for e, _ in bad] == [good.key], f"{corrupt.__name__}: {bad}"
    cache.verify(fix=True)
    assert entry_dirs(cache_env) == [other.entry.path], corrupt.__name__


# -- read-only layers ---------------------------------------------------------------------------

def test_readonly_layer_hits_and_writes_nothing(cache_env, tmp_path, monkeypatch):
    a = cache_env
    built = [build(c) for c in CONFIGS[:2]]
    snapshot = {p: p.read_bytes() for p in files_under(a)}
    b = tmp_path / "b"
    monkeypatch.setenv("KERNELGEN_CACHE_RO", str(a))
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(b))
    for cfg, first in zip(CONFIGS[:2], built, strict=True):
        res = build(cfg)
        assert res.compiled is False, f"{cfg}: read-only layer missed"
        assert res.cubin == first.cubin and res.entry.readonly, cfg
        assert res.entry.path.is_relative_to(a), res.entry.path
    assert files_under(b) == [], f"written to the writable layer: {files_under(b)}"
    assert {p: p.read_bytes() for p in files_under(a)} == snapshot, "read-only layer modified"
    # a miss in every layer compiles into the writable one only
    res = build(CONFIGS[2])
    assert res.compiled and res.entry.path.is_relative_to(b), res.entry.path
    assert {p: p.read_bytes() for p in files_under(a)} == snapshot, "read-only layer modified"
    ro_entry = next(e for e in default_cache().entries() if e.readonly)
    with pytest.raises(CacheError, match="read-only"):
        default_cache().remove(ro_entry)
    assert ro_entry.path.is_dir()


def test_readonly_layer_corrupt_is_skipped_and_rebuilt(cache_env, tmp_path, monkeypatch):
    a = cache_env
    good = build(E4M4)
    _flip_byte(good.entry.path)
    corrupt_bytes = (good.entry.path / CUBIN).read_bytes()
    b = tmp_path / "b"
    monkeypatch.setenv("KERNELGEN_CACHE_RO", str(a))
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(b))
    with pytest.warns(RuntimeWarning, match="corrupt entry .* read-only layer skipped"):
        res = build(E4M4)
    assert res.compiled is True and res.cubin == good.cubin
    assert res.entry.path.is_relative_to(b) and not res.entry.readonly, res.entry.path
    assert (good.entry.path / CUBIN).read_bytes() == corrupt_bytes, "read-only entry was touched"
    # the writable copy now answers (the corrupt read-only one is skipped silently after that)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert build(E4M4).compiled is False


# -- unwritable or full disk --------------------------------------------------------------------

def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "afile").write_text("not a folder")
    return tmp_path / "afile" / "cache"  # can never be created, even by root


def _read_only_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    return d / "cache"


@pytest.mark.parametrize("where", [
    _under_a_file,
    pytest.param(_read_only_dir, marks=pytest.mark.skipif(
        hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory modes")),
], ids=lambda f: f.__name__.strip("_"))
def test_unwritable_cache_warns_once_and_works(where, cache_env, tmp_path, monkeypatch):
    root = where(tmp_path)
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(root))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [build(E4M4), build(CONFIGS[1]), build(E4M4)]
    mine = [w for w in caught if "kernelgen" in str(w.message)]
    assert len(mine) == 1, f"{where.__name__}: {[str(w.message) for w in mine]}"
    assert issubclass(mine[0].category, RuntimeWarning)
    assert "not writable" in str(mine[0].message) and "KERNELGEN_CACHE_DIR" in str(mine[0].message)
    for r in results:
        assert r.compiled is True and r.entry is None and r.cubin.startswith(b"\x7fELF"), r.config
    assert results[0].cubin == results[2].cubin
    assert default_cache().writable is False
    assert not root.exists()


def test_full_disk_warns_once_and_works(cache_env, monkeypatch):
    def enospc(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(cache_mod, "_write_synced", enospc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [build(c) for c in CONFIGS[:3]]
    mine = [w for w in caught if "kernelgen" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    assert issubclass(mine[0].category, RuntimeWarning)
    assert "could not write" in str(mine[0].message), str(mine[0].message)
    for r in results:
        assert r.compiled is True and r.entry is None and r.cubin.startswith(b"\x7fELF"), r.config
    assert entry_dirs(cache_env) == [], "a partial entry was published"
    assert list((cache_env / "v1" / "tmp").iterdir()) == [], "build folder left behind"
    # the disk has room again: the next build publishes
    monkeypatch.undo()
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(cache_env))
    res = build(E4M4)
    assert res.compiled and res.entry is not None
    assert_valid_entry(res.entry.path, res.key, res.cubin, "after ENOSPC")


# -- LRU eviction -------------------------------------------------------------------------------

def _age(results, order):
    """Give the entries last-used times: order[0] oldest ... order[-1] newest."""
    now = time.time()
    for rank, i in enumerate(order):
        t = now - 1000 * (len(order) - rank)
        os.utime(results[i].entry.path, (t, t))


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (2, 0, 3, 1)], ids=str)
def test_gc_keeps_most_recently_used(order, cache_env):
    results = [build(c) for c in CONFIGS]
    _age(results, order)
    newest = [results[i] for i in order[2:]]
    oldest = [results[i] for i in order[:2]]
    cap = sum(_size(r.entry.path) for r in newest)
    removed = DiskCache().gc(max_bytes=cap)
    assert sorted(e.key for e in removed) == sorted(r.key for r in oldest), f"{order=}"
    assert entry_dirs(cache_env) == sorted(r.entry.path for r in newest), f"{order=}"
    assert DiskCache().total_bytes() <= cap
    for r in newest:
        assert build(r.config).compiled is False, f"{order=} {r.config}"
    for r in oldest:
        assert build(r.config).compiled is True, f"{order=} {r.config}"


def test_gc_counts_a_load_as_use(cache_env):
    """Loading an entry (in a new process) makes it the most recently used."""
    results = [build(c) for c in CONFIGS]
    _age(results, (0, 1, 2, 3))
    assert DiskCache().load(results[0].key) is not None  # the oldest is used again
    cap = _size(results[0].entry.path) + _size(results[3].entry.path)
    removed = DiskCache().gc(max_bytes=cap)
    assert sorted(e.key for e in removed) == sorted([results[1].key, results[2].key])
    assert entry_dirs(cache_env) == sorted([results[0].entry.path, results[3].entry.path])


def test_gc_under_cap_removes_nothing(cache_env):
    results = [build(c) for c in CONFIGS]
    total = sum(_size(r.entry.path) for r in results)
    assert DiskCache().gc(max_bytes=total) == []
    assert len(entry_dirs(cache_env)) == 4
    assert len(DiskCache().gc(max_bytes=0)) == 4 and entry_dirs(cache_env) == []


# -- strict mode --------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [E4M4, KbitRepackConfig(arch="sm_100a", bits=5)],
                         ids=lambda c: c.short())
def test_strict_mode(cfg, cache_env, monkeypatch):
    monkeypatch.setenv("KERNELGEN_DISABLE_JIT", "1")
    with pytest.raises(JitDisabledError) as exc:
        build(cfg)
    msg = str(exc.value)
    assert cfg.short() in msg and "kernelgen prewarm" in msg, msg
    assert f"--arch {cfg.arch}" in msg and f"--family {cfg.family}" in msg, msg
    assert entry_dirs(cache_env) == []
    monkeypatch.setenv("KERNELGEN_DISABLE_JIT", "0")
    first = build(cfg)
    assert first.compiled
    monkeypatch.setenv("KERNELGEN_DISABLE_JIT", "1")
    res = build(cfg)
    assert res.compiled is False and res.cubin == first.cubin, cfg


def test_strict_mode_with_unwritable_cache(cache_env, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(_under_a_file(tmp_path)))
    monkeypatch.setenv("KERNELGEN_DISABLE_JIT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(JitDisabledError, match="kernelgen prewarm"):
            build(E4M4)


# -- describe_miss ------------------------------------------------------------------------------

def test_describe_miss_hit(cache_env):
    res = build(E4M4)
    lines = describe_miss(default_cache(), key_parts(E4M4)[0])
    assert lines == [f"hit: {res.key}"]


def test_describe_miss_never_built(cache_env):
    build(E4M4)
    cfg = KbitQuantizeConfig(arch="sm_90a")
    text = "\n".join(describe_miss(default_cache(), key_parts(cfg)[0]))
    assert text.startswith("miss") and "no entry" in text and "kernelgen prewarm" in text, text
    assert "1 entries of family 'kbit'" in text, text


def test_describe_miss_other_arch(cache_env):
    """Prewarmed for one target, asked for another (GB10 after an sm_120a prewarm): say so."""
    build(E4M4)
    text = "\n".join(describe_miss(default_cache(), key_parts(E4M4Config(arch="sm_121a"))[0]))
    assert "cached for sm_90a only, not sm_121a" in text and "prewarm --arch sm_121a" in text, text


def test_describe_miss_renamed_entry(cache_env):
    res = build(E4M4)
    src = default_cache().entry_path(res.key)
    dst = default_cache().entry_path("00" + res.key[2:])
    dst.parent.mkdir(parents=True, exist_ok=True)
    src.rename(dst)
    text = "\n".join(describe_miss(default_cache(), key_parts(E4M4)[0]))
    assert "its folder name is not its key" in text, text


def test_describe_miss_nvrtc(cache_env, monkeypatch):
    build(E4M4)
    monkeypatch.setattr(jit, "nvrtc_version", lambda: "99.9")
    parts = key_parts(E4M4)[0]
    lines = describe_miss(default_cache(), parts)
    text = "\n".join(lines)
    assert lines[0] == f"miss: {key_of(parts)}", text
    assert "nvrtc: wanted '99.9', entry has" in text, text
    assert len(lines) == 2 and "config" not in lines[1], text


def test_describe_miss_header(cache_env, templates_copy):
    build(E4M4)
    p = templates_copy / "common" / "dtypes.cuh"
    p.write_text(p.read_text() + "\n// edited\n")
    text = "\n".join(describe_miss(default_cache(), key_parts(E4M4)[0]))
    assert "header common/dtypes.cuh changed" in text, text
    assert "common/e4m4.cuh" not in text, text
