"""`kernelgen cache export | import`: round trip, skip present keys, refuse unsafe or bad members."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from .conftest import SEED_CONFIGS
from .test_cache import keys_in


def test_export_import_round_trip(warm_cache, cli, tmp_path, monkeypatch):
    archive = tmp_path / "kernels.tar.gz"
    rc, out, _ = cli("cache", "export", archive)
    assert rc == 0 and f"{len(SEED_CONFIGS)} entries" in out
    names = tarfile.open(archive).getnames()
    assert all(n.startswith("v1/") and n.count("/") == 3 for n in names)

    other = tmp_path / "other"
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(other))
    rc, out, err = cli("cache", "import", archive)
    assert rc == 0, out + err
    assert f"{len(SEED_CONFIGS)} imported, 0 skipped, 0 rejected" in out
    assert keys_in(other) == keys_in(warm_cache)
    assert cli("cache", "verify")[0] == 0
    for key in keys_in(other):  # manifests travel unchanged
        rel = Path("v1", key[:2], key, "manifest.json")
        assert (other / rel).read_bytes() == (warm_cache / rel).read_bytes()
    rc, out, _ = cli("cache", "import", archive)
    assert rc == 0 and f"0 imported, {len(SEED_CONFIGS)} skipped" in out
    assert list((other / "v1" / "tmp").iterdir()) == []  # the staging folder is gone


def test_export_by_filter(warm_cache, cli, tmp_path):
    archive = tmp_path / "sm80.tar.gz"
    assert cli("cache", "export", archive, "--arch", "sm_80")[0] == 0
    keys = {n.split("/")[2] for n in tarfile.open(archive).getnames()}
    assert len(keys) == 1
    # nothing matches: refused, and the archive of that name is left as it was
    before = archive.read_bytes()
    rc, _, err = cli("cache", "export", archive, "--arch", "sm_80", "--older-than", "3650")
    assert rc == 1 and "no entry matches" in err and archive.read_bytes() == before


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE,
         link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, (len(data) if kind == tarfile.REGTYPE else 0)
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def test_import_refuses_unsafe_and_tampered_members(warm_cache, cli, tmp_path, monkeypatch):
    good, tampered, *_ = sorted(keys_in(warm_cache))
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for key in (good, tampered):
            for f in sorted((warm_cache / "v1" / key[:2] / key).iterdir()):
                data = f.read_bytes()
                if key == tampered and f.name == "kernel.cubin":
                    data = data[:-1] + bytes([data[-1] ^ 1])
                _add(tar, f"v1/{key[:2]}/{key}/{f.name}", data)
        _add(tar, "../escape.txt")
        _add(tar, "/tmp/absolute.txt")
        _add(tar, "v1/ab/link", kind=tarfile.SYMTYPE, link="/etc/passwd")
        _add(tar, "v1/notes.txt")
    other = tmp_path / "other"
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(other))
    rc, out, _ = cli("cache", "import", archive, "--json")
    assert rc == 1
    res = json.loads(out)
    assert res["imported"] == [good] and res["skipped"] == []
    reasons = dict(res["rejected"])
    assert reasons["../escape.txt"] == "'..' in path"
    assert reasons["/tmp/absolute.txt"] == "absolute path"
    assert reasons["v1/ab/link"] == "link"
    assert "not a cache entry file" in reasons["v1/notes.txt"]
    assert "sha256" in reasons[tampered]
    assert keys_in(other) == {good}
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/absolute.txt").exists()


def test_import_refuses_a_renamed_entry(warm_cache, cli, tmp_path, monkeypatch):
    """The folder name must be the key of the manifest's parts, not whatever the archive says."""
    src, *_ = sorted(keys_in(warm_cache))
    fake = "0" * 64
    archive = tmp_path / "renamed.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for f in (warm_cache / "v1" / src[:2] / src).iterdir():
            _add(tar, f"v1/00/{fake}/{f.name}", f.read_bytes())
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path / "other"))
    rc, out, _ = cli("cache", "import", archive)
    assert rc == 1 and "folder name is not the key" in out


def test_import_of_a_non_archive_is_a_usage_error(cache_dir, cli, tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    rc, _, err = cli("cache", "import", junk)
    assert rc == 2 and "not a readable .tar.gz" in err
    rc, _, err = cli("cache", "import", tmp_path / "absent.tar.gz")
    assert rc == 2 and "no such file" in err


def test_import_rejects_a_damaged_manifest_and_keeps_the_rest(warm_cache, cli, tmp_path, monkeypatch):
    from .test_cache import damage

    archive = tmp_path / "kernels.tar.gz"
    bad = sorted(keys_in(warm_cache))[:3]
    damage(warm_cache, bad)  # parts "x"; parts {"config": []}; cubin_size "abc" (aborted it)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(warm_cache / "v1", arcname="v1", filter=lambda i: None if "/tmp" in i.name or
                "/locks" in i.name else i)
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path / "other"))
    rc, out, err = cli("cache", "import", archive)
    assert rc == 1 and "Traceback" not in err, err
    assert f"{len(SEED_CONFIGS) - 3} imported, 0 skipped, 3 rejected" in out, out
    assert keys_in(tmp_path / "other") == keys_in(warm_cache) - set(bad)
