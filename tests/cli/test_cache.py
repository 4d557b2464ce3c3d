"""`kernelgen cache ls | info | show | explain | verify | gc | purge` on a seeded cache."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kernelgen.core.cache import MANIFEST
from kernelgen.core.jit import default_cache

from .conftest import SEED_CONFIGS

N = len(SEED_CONFIGS)


def keys_in(root: Path) -> set[str]:
    return {p.name for p in (root / "v1").glob("??/*")}


def ls_json(cli, *args: str) -> list[dict]:
    rc, out, err = cli("cache", "ls", "--json", *args)
    assert rc == 0, err
    return json.loads(out)


def test_ls_table_and_json(warm_cache, cli):
    rows = ls_json(cli)
    assert {r["key"] for r in rows} == keys_in(warm_cache) and len(rows) == N
    assert all(r["registers"] > 0 and r["cubin_size"] > 0 and r["layer"] == "rw" for r in rows)
    rc, out, _ = cli("cache", "ls")
    assert rc == 0
    for r in rows:
        assert r["key"][:12] in out
    assert "KbitQuantizeConfig" in out and "bits=2 dtype=float16" in out
    assert [r["arch"] for r in ls_json(cli, "--arch", "sm_80")] == ["sm_80"]
    assert len(ls_json(cli, "--family", "kbit", "--arch", "sm_90a")) == N - 1


def test_ls_unknown_filter_is_a_usage_error(warm_cache, cli):
    rc, _, err = cli("cache", "ls", "--family", "nope")
    assert rc == 2 and "--family 'nope': unknown" in err
    rc, _, err = cli("cache", "ls", "--arch", "")  # once: no filter, every entry listed
    assert rc == 2 and "--arch '': an empty list" in err


def test_info_counts_layers(warm_cache, seed_cache, cli, monkeypatch, tmp_path):
    rc, out, _ = cli("cache", "info")
    assert rc == 0 and str(warm_cache) in out and "size cap" in out
    info = json.loads(cli("cache", "info", "--json")[1])
    (layer,) = info["layers"]
    assert (layer["entries"], layer["writable"], layer["readonly"]) == (N, True, False)
    assert layer["bytes"] == default_cache().total_bytes()
    assert {(r["family"], r["arch"]): r["entries"] for r in info["by_family_arch"]} == {
        ("kbit", "sm_90a"): N - 1, ("kbit", "sm_80"): 1}
    # a read-only layer in front of an empty writable one
    monkeypatch.setenv("KERNELGEN_CACHE_RO", str(seed_cache))
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path / "empty"))
    ro, rw = json.loads(cli("cache", "info", "--json")[1])["layers"]
    assert (ro["readonly"], ro["entries"], rw["entries"]) == (True, N, 0)
    assert {r["layer"] for r in ls_json(cli)} == {"ro"}


def test_show_and_info_key(warm_cache, cli):
    key = sorted(keys_in(warm_cache))[0]
    rc, out, _ = cli("cache", "show", key[:8])
    assert rc == 0 and f"key:    {key}" in out and '"cubin_sha256"' in out and "compile log:" in out
    assert cli("cache", "info", key[:8])[1] == out
    shown = json.loads(cli("cache", "show", key, "--json")[1])
    assert shown["manifest"]["key"] == key
    rc, _, err = cli("cache", "show", "ffffffffff")
    assert rc == 2 and "no cache entry" in err


def test_explain_hit_and_never_built(warm_cache, cli):
    rc, out, _ = cli("cache", "explain", "--family", "kbit", "--kind", "KbitQuantizeConfig",
                     "--set", "bits=2", "--set", "dtype=float16", "--arch", "sm_90a")
    assert rc == 0 and "\nhit: " in out
    rc, out, _ = cli("cache", "explain", "--config",
                     '{"kind": "KbitQuantizeConfig", "bits": 5, "dtype": "float16", "arch": "sm_90a"}')
    assert rc == 0 and "miss: no entry for this config" in out
    before = keys_in(warm_cache)
    res = json.loads(cli("cache", "explain", "--kind", "KbitRepackConfig", "--set", "bits=3",
                         "--arch", "sm_80", "--json")[1])
    assert res["hit"] is False and res["config"]["bits"] == 3
    assert keys_in(warm_cache) == before  # explain never compiles


def test_explain_names_a_changed_header(warm_cache, cli, templates_copy):
    args = ("cache", "explain", "--kind", "KbitQuantizeConfig", "--set", "bits=2", "--set",
            "dtype=float16", "--arch", "sm_90a")
    rc, out, _ = cli(*args)
    assert "\nhit: " in out  # a moved copy of the templates keeps the key
    header = templates_copy / "kbit" / "kbit.cuh"
    header.write_text(header.read_text() + "\n// an edit that changes the bytes\n")
    rc, out, _ = cli(*args)
    assert rc == 0 and "\nmiss: " in out
    assert "header kbit/kbit.cuh changed" in out


def test_explain_usage_errors(warm_cache, cli):
    for args, message in [
        (["--kind", "NoSuchConfig"], "not a config kind"),
        (["--family", "kbit", "--kind", "E4M4Config", "--set", "tile=3"], "has no field(s) tile"),
        (["--kind", "KbitQuantizeConfig", "--set", "bits=7", "--arch", "sm_90a"], "bits=7"),
        (["--kind", "KbitQuantizeConfig", "--set", "bits"], "expected FIELD=VALUE"),
        (["--config", "[1]"], "expected a JSON object"),
        ([], "explain needs the config: --kind NAME"),
        (["--kind", "E4M4Config", "--arch", ""], "--arch '': an empty list"),
        (["--kind", "E4M4Config", "--arch", "all"], "explain takes one target"),
        (["--kind", "E4M4Config", "--arch", "sm_104a"], "not a kernelgen target"),
    ]:
        rc, _, err = cli("cache", "explain", *args)
        assert rc == 2 and message in err, (args, err)


def test_verify_detects_a_flipped_byte_and_fix_removes_it(warm_cache, cli):
    key = sorted(keys_in(warm_cache))[0]
    cubin = warm_cache / "v1" / key[:2] / key / "kernel.cubin"
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    rc, out, _ = cli("cache", "verify")
    assert rc == 1 and key[:12] in out and "sha256" in out
    rc, out, _ = cli("cache", "verify", "--fix")
    assert rc == 0 and f"removed  {key[:12]}" in out
    assert key not in keys_in(warm_cache)
    assert cli("cache", "verify")[0] == 0


def test_gc_max_bytes_evicts_least_recently_used(warm_cache, cli):
    entries = sorted(default_cache().entries(), key=lambda e: e.key)
    now = time.time()
    for age, e in enumerate(reversed(entries)):  # entries[0] is the oldest
        os.utime(e.path, (now - 1000 * (age + 1), now - 1000 * (age + 1)))
    sizes = [e.disk_bytes for e in entries]
    cap = sum(sizes) - sizes[0] - sizes[1]  # room for all but the two oldest
    rc, out, _ = cli("cache", "gc", "--max-bytes", str(cap), "--dry-run")
    assert rc == 0 and "would remove" in out and keys_in(warm_cache) == {e.key for e in entries}
    res = json.loads(cli("cache", "gc", "--max-bytes", str(cap), "--json")[1])
    assert [r["key"] for r in res["removed"]] == [entries[0].key, entries[1].key]
    assert res["freed_bytes"] == sizes[0] + sizes[1]
    assert keys_in(warm_cache) == {e.key for e in entries[2:]}
    rc, out, _ = cli("cache", "gc", "--max-bytes", "500M")
    assert rc == 0 and "removed 0 entries" in out and len(keys_in(warm_cache)) == N - 2


def test_gc_by_filter(warm_cache, cli):
    rc, out, _ = cli("cache", "gc", "--arch", "sm_80")
    assert rc == 0 and "removed 1 entries" in out
    assert {r["arch"] for r in ls_json(cli)} == {"sm_90a"}
    assert cli("cache", "gc", "--max-bytes", "lots")[0] == 2


def test_purge_by_filter_and_refuses_without_one(warm_cache, cli):
    rc, _, err = cli("cache", "purge")
    assert rc == 2 and "--all" in err and len(keys_in(warm_cache)) == N
    rc, out, _ = cli("cache", "purge", "--family", "kbit", "--arch", "sm_80")
    assert rc == 0 and "removed 1 entries" in out
    assert [r["arch"] for r in ls_json(cli)] == ["sm_90a"] * (N - 1)
    rc, out, _ = cli("cache", "purge", "--family", "kbit", "--dry-run")
    assert rc == 0 and len(keys_in(warm_cache)) == N - 1
    assert cli("cache", "purge", "--older-than", "1")[2] == ""  # used just now: nothing is older
    assert len(keys_in(warm_cache)) == N - 1
    rc, _, _ = cli("cache", "purge", "--family", "kbit")
    assert rc == 0 and keys_in(warm_cache) == set()


def test_purge_all(warm_cache, cli):
    rc, out, _ = cli("cache", "purge", "--all", "--yes")
    assert rc == 0 and f"removed {N} entries" in out and keys_in(warm_cache) == set()


def test_purge_version_not_current(warm_cache, cli):
    old, toolchain, *_ = sorted(keys_in(warm_cache))
    for key, field, value in [(old, "package_version", "0.0.1"), (toolchain, "nvrtc", "11.8")]:
        path = warm_cache / "v1" / key[:2] / key / MANIFEST
        manifest = json.loads(path.read_text())
        manifest["parts"][field] = value
        path.write_text(json.dumps(manifest))
    rc, out, _ = cli("cache", "purge", "--nvrtc-not-current", "--dry-run")
    assert rc == 0 and toolchain[:12] in out and old[:12] not in out
    rc, out, _ = cli("cache", "purge", "--version-not-current")
    assert rc == 0 and "removed 2 entries" in out
    assert keys_in(warm_cache).isdisjoint({old, toolchain}) and len(keys_in(warm_cache)) == N - 2


def test_gc_without_flags_applies_the_configured_cap(warm_cache, cli, monkeypatch):
    monkeypatch.setenv("KERNELGEN_CACHE_MAX_BYTES", "1K")
    rc, out, _ = cli("cache", "gc")
    assert rc == 0 and f"removed {N} entries" in out and keys_in(warm_cache) == set()


def test_removal_works_in_a_layer_without_tmp(warm_cache, cli):
    """A layer unpacked by hand (entry folders only, no tmp/ or locks/) must still be fixable:
    removal renames an entry into tmp/ first, so tmp/ has to be created on demand."""
    import shutil

    for sub in ("tmp", "locks"):
        shutil.rmtree(warm_cache / "v1" / sub, ignore_errors=True)
    key = sorted(keys_in(warm_cache))[0]
    (warm_cache / "v1" / key[:2] / key / "kernel.cubin").write_bytes(b"garbage")
    assert cli("cache", "verify", "--fix")[0] == 0
    assert key not in keys_in(warm_cache) and cli("cache", "verify")[0] == 0
    shutil.rmtree(warm_cache / "v1" / "tmp")
    assert cli("cache", "purge", "--arch", "sm_80")[0] == 0
    assert {r["arch"] for r in ls_json(cli)} == {"sm_90a"}


def test_older_than_takes_finite_days_only(warm_cache, cli):
    """nan compares False with every age, so it matched every entry (and got past purge's --all
    guard); inf matched none. Both are usage errors, as -1 and abc."""
    for value in ("nan", "inf", "1e400", "-1", "abc"):
        for cmd in (["purge"], ["gc"], ["ls"], ["export", warm_cache.parent / "x.tar.gz"]):
            rc, _, err = cli("cache", *cmd, "--older-than", value)
            assert rc == 2 and f"--older-than {value!r}: expected a number of days" in err, (cmd, err)
    assert len(keys_in(warm_cache)) == N


def test_gc_names_what_it_could_not_remove(warm_cache, cli, monkeypatch):
    """A layer whose folders cannot be renamed away (read-only, busy): gc removes nothing, says
    so with the reason and exits 1 (it used to report every entry removed, exit 0)."""
    import errno

    rename = os.rename

    def deny(src, dst):
        if Path(dst).name.startswith("trash-"):
            raise PermissionError(errno.EACCES, "Permission denied", str(src))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", deny)
    for args in (["--max-bytes", "1K"], ["--arch", "sm_80"]):
        rc, out, err = cli("cache", "gc", *args, "--json")
        assert rc == 1 and json.loads(out)["removed"] == [], (args, out)
        assert "could not remove" in err and "Permission denied" in err, err
    assert len(keys_in(warm_cache)) == N and default_cache().gc(0) == []


DAMAGES = {  # valid JSON manifests of the wrong shape
    "parts": lambda m: m.update(parts="x"),
    "config": lambda m: m.update(parts={"config": []}),
    "cubin_size": lambda m: m.update(cubin_size="abc"),
    "compile_seconds": lambda m: m.update(compile_seconds="slow"),
}


def damage(root: Path, keys: list[str]) -> None:
    for key, how in zip(keys, DAMAGES.values(), strict=False):  # the first len(keys) damages
        path = root / "v1" / key[:2] / key / MANIFEST
        manifest = json.loads(path.read_text())
        how(manifest)
        path.write_text(json.dumps(manifest))


def test_manifests_of_the_wrong_shape_are_damaged_entries(warm_cache, cli, tmp_path):
    """They used to raise AttributeError / ValueError in every command (even verify --fix):
    now ls / info / gc / purge / export skip them with a note, verify names them, --fix
    removes them."""
    bad = sorted(keys_in(warm_cache))[:len(DAMAGES)]
    damage(warm_cache, bad)
    good = N - len(bad)
    note = f"skipped {len(bad)} damaged entries"
    for args in (["ls"], ["info"], ["gc", "--max-bytes", "1G"], ["purge", "--arch", "sm_80", "--dry-run"],
                 ["export", tmp_path / "a.tar.gz"]):
        rc, out, err = cli("cache", *args)
        assert rc == 0 and note in err and "Traceback" not in err, (args, err)
    assert len(ls_json(cli)) == good
    rc, out, _ = cli("cache", "verify")
    assert rc == 1 and all(k[:12] in out for k in bad) and "expected an integer" in out, out
    rc, out, _ = cli("cache", "verify", "--fix")
    assert rc == 0 and f"{len(bad)} removed" in out
    assert len(keys_in(warm_cache)) == good and cli("cache", "verify")[0] == 0


def test_info_does_not_create_a_missing_cache_dir(cache_dir, cli):
    """A typo in KERNELGEN_CACHE_DIR: info reports the folder absent (and whether a build could
    create it) without creating it, as ls / verify / gc."""
    rc, out, _ = cli("cache", "info")
    assert rc == 0 and "yes (absent)" in out
    (layer,) = json.loads(cli("cache", "info", "--json")[1])["layers"]
    assert (layer["exists"], layer["writable"]) == (False, True)
    assert not cache_dir.exists()
