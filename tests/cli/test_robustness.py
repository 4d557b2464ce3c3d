"""User errors end in one line and an exit code, never a traceback; prewarm works in strict mode."""

import json

from .conftest import PREWARM_ARGS


def test_import_of_a_folder_is_an_error_not_a_traceback(cache_dir, cli, tmp_path):
    rc, out, err = cli("cache", "import", str(tmp_path))
    assert rc == 1, (rc, out, err)
    assert err.startswith("kernelgen: error:") and "Traceback" not in err


def test_profile_spec_values_are_checked(cache_dir, cli, tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"archs": ["sm_90a"], "families": {"kbit": {"bits": 4}}}))
    rc, out, err = cli("prewarm", "--profile", str(prof))
    assert rc == 2 and "families.kbit.bits" in err and "must be a list" in err, err


def test_prewarm_compiles_under_disable_jit(cache_dir, cli, monkeypatch):
    monkeypatch.setenv("KERNELGEN_DISABLE_JIT", "1")
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "-j", "1", "--quiet")
    assert rc == 0, err
    assert " 0 failed" in out, out
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "--check")
    assert rc == 0, (out, err)


def test_gc_without_flags_respects_no_cap(warm_cache, cli, monkeypatch):
    monkeypatch.setenv("KERNELGEN_CACHE_MAX_BYTES", "0")
    rc, out, err = cli("cache", "gc", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["removed"] == [] and summary["remaining_bytes"] > 0, summary
