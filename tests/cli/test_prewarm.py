"""`kernelgen prewarm`: builds exactly the family tables, reports cached on a rerun, --check,
profile files, parallel workers."""

from __future__ import annotations

import json

import pytest

from kernelgen.arch import ALL_ARCHS
from kernelgen.core import registry
from kernelgen.core.registry import Family
from kernelgen.kbit import E4M4Config

from .conftest import PREWARM_ARGS, PREWARM_CONFIGS, run_module

N = len(PREWARM_CONFIGS)


def test_prewarm_compiles_then_reports_cached(cache_dir, cli):
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "-j", "1")
    assert rc == 0, err
    assert f"{N} compiled, 0 already cached, 0 failed" in out
    assert f"[{N}/{N}] " in err and "eta" in err  # one progress line per config
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "-j", "1", "--json", "--quiet")
    assert rc == 0, err
    summary = json.loads(out)
    assert (summary["compiled"], summary["cached"], summary["failed"]) == (0, N, 0)
    assert {json.dumps(r["config"], sort_keys=True) for r in summary["results"]} == {
        json.dumps(c.as_dict(), sort_keys=True) for c in PREWARM_CONFIGS}
    assert err == ""  # --quiet: no progress lines


def test_prewarm_parallel_and_check_exit_codes(cache_dir):
    before = run_module("prewarm", *PREWARM_ARGS, "--check")
    assert before.returncode == 1, before.stderr
    assert before.stdout.count("missing  ") == N
    built = run_module("prewarm", *PREWARM_ARGS, "-j", "2")
    assert built.returncode == 0, built.stderr
    assert f"{N} compiled" in built.stdout
    assert "with 2 worker(s)" in built.stderr
    after = run_module("prewarm", *PREWARM_ARGS, "--check", "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["missing"] == []


def test_prewarm_profile_file(cache_dir, cli, tmp_path):
    prof = tmp_path / "model.json"
    prof.write_text(json.dumps({"archs": ["sm_80"], "families": {"kbit": {"bits": [3], "dtypes": ["bfloat16"]}}}))
    rc, out, err = cli("prewarm", "--profile", prof, "-j", "1", "--json", "--quiet")
    assert rc == 0, err
    configs = [r["config"] for r in json.loads(out)["results"]]
    assert configs and all(c["arch"] == "sm_80" for c in configs)
    assert all(c.get("bits", 3) == 3 and c.get("dtype", "bfloat16") == "bfloat16" for c in configs)
    assert cli("prewarm", "--profile", prof, "--check")[0] == 0
    # flags win over the file: another arch is missing
    assert cli("prewarm", "--profile", prof, "--check", "--arch", "sm_90a")[0] == 1


def test_profile_spec_reaches_the_family_untouched(cache_dir, cli, tmp_path, monkeypatch):
    seen = []

    def configs(archs, spec):
        seen.append((list(archs), spec))
        return [E4M4Config(arch=a) for a in archs]

    monkeypatch.setitem(registry._FAMILIES, "fake", Family("fake", (E4M4Config,), configs))
    spec = {"shapes": [[1, 4096, 4096], [64, 14336, 4096]], "bits": [4]}
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"archs": ["sm_90a", "sm_80"], "families": {"fake": spec}}))
    rc, out, _ = cli("prewarm", "--profile", prof, "--check", "--json")
    assert rc == 1 and len(json.loads(out)["missing"]) == 2
    assert seen == [(["sm_90a", "sm_80"], spec)]


def test_prewarm_deduplicates(cache_dir, cli, monkeypatch):
    twice = lambda archs, spec: [E4M4Config(arch=a) for a in archs for _ in range(3)]  # noqa: E731
    monkeypatch.setitem(registry._FAMILIES, "dup", Family("dup", (E4M4Config,), twice))
    rc, out, _ = cli("prewarm", "--family", "dup", "--arch", "sm_90a,sm_90a", "--check", "--json")
    assert rc == 1 and json.loads(out)["total"] == 1


@pytest.mark.parametrize("args, message", [
    (["--family", "nope"], "--family 'nope': unknown"),
    (["--arch", "sm_70"], "--arch 'sm_70': not a kernelgen target"),
    (["--bits", "9", "--arch", "sm_90a"], "--bits 9: not accepted by kbit, kbit_gemm, moe"),
    (["--bits", "four", "--arch", "sm_90a"], "--bits four: expected integers"),
    (["-j", "0", "--arch", "sm_90a"], "-j 0"),
])
def test_prewarm_usage_errors(cache_dir, cli, args, message):
    rc, out, err = cli("prewarm", *args)
    assert rc == 2
    assert err.startswith("kernelgen: error: ") and message in err, err


def test_bad_profile_is_a_usage_error(cache_dir, cli, tmp_path):
    bad = tmp_path / "bad.json"
    for text, message in [("{", "not valid JSON"), ('{"arch": ["sm_90a"]}', "unknown keys"),
                          ('{"families": {"kbit": [4]}}', "spec object"),
                          ('{"archs": ["sm_121"]}', "bad.json: archs: 'sm_121': not a kernelgen target")]:
        bad.write_text(text)
        rc, _, err = cli("prewarm", "--profile", bad)
        assert rc == 2 and message in err, err
    rc, _, err = cli("prewarm", "--profile", tmp_path / "absent.json")
    assert rc == 2 and "cannot read" in err


def test_prewarm_reports_compile_failures(cache_dir, cli, templates_copy):
    tpl = templates_copy / "kbit" / "quantize.cu.jinja"
    tpl.write_text(tpl.read_text() + '\n#error "deliberately broken for the test"\n')
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "-j", "1")
    assert rc == 1
    assert f"{N - 1} compiled, 0 already cached, 1 failed" in out
    assert "FAILED KbitQuantizeConfig(arch=sm_90a, bits=2, dtype=float16)" in err
    assert "deliberately broken" in err  # the NVRTC log's first lines


def test_ctrl_c_stops_a_parallel_prewarm(cache_dir):
    """SIGINT to the process group (Ctrl-C) once the first config is done, then again: exit 130
    at once, the queued configs not built, nothing hung, the cache consistent."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from .conftest import REPO

    args = ["prewarm", "--family", "kbit,mx", "--arch", "sm_90a", "-j", "2"]
    total = 89  # kbit + mx on one arch: seconds of work on 2 cores
    proc = subprocess.Popen(
        [sys.executable, "-m", "cache_tools", *args], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as on a terminal
    try:
        while not proc.stderr.readline().startswith("["):  # the first config is done
            assert proc.poll() is None, proc.stderr.read()
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "kernelgen: interrupted" in err and "Traceback" not in err and "Exception" not in err, err
    assert seconds < 5, f"took {seconds:.1f}s to stop"
    built = len(list(cache_dir.glob("v1/??/*")))
    assert built < total, "the queue was drained after Ctrl-C"
    verify = run_module("cache", "verify")
    assert verify.returncode == 0 and " 0 bad" in verify.stdout, verify.stdout


def test_prewarm_fails_when_the_cache_cannot_store(cache_dir, cli, monkeypatch):
    """A cache dir that is a file, or a full disk: the builds are 'not stored', the reason is
    printed once, exit 1 (and --check agrees that they are missing)."""
    import errno

    from kernelgen.core import cache as cache_mod

    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    cache_dir.write_text("not a folder")
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "-j", "1")
    assert rc == 1, out
    assert f"0 compiled, 0 already cached, 0 failed, {N} not stored" in out
    assert err.count(f"NOT STORED {N} compiled config(s): cache directory {cache_dir} is not writable") == 1, err
    assert "RuntimeWarning" not in err
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(cache_dir.parent / "full"))

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(cache_mod, "_write_synced", full)
    rc, out, err = cli("prewarm", *PREWARM_ARGS, "-j", "1", "--json", "--quiet")
    summary = json.loads(out)
    assert rc == 1 and (summary["compiled"], summary["unstored"]) == (0, N), out
    assert "No space left on device" in err and err.count("NOT STORED") == 1, err
    assert cli("prewarm", *PREWARM_ARGS, "--check")[0] == 1


@pytest.mark.parametrize("args, message", [
    (["--family", "kbit_gemm", "--bits", "7"], "--bits 7: not accepted by kbit_gemm (accepted: 2, 3, 4, 5)"),
    (["--family", "kbit_gemm", "--bits", "1"], "--bits 1: not accepted"),
    (["--family", "moe", "--bits", "5"], "--bits 5: not accepted by moe (accepted: 2, 3, 4)"),
    (["--family", "mx", "--dtypes", "flaot16"], "--dtypes flaot16: not accepted by mx (accepted: float16,"),
    (["--family", "fp4_gemm,mx_gemm", "--dtypes", "float32"], "not accepted by fp4_gemm, mx_gemm"),
    (["--family", "mx", "--bits", "4"], "--bits 4: mx reads no 'bits'"),
])
def test_spec_values_no_family_takes_are_usage_errors(cache_dir, cli, args, message):
    """A value no family of the run takes is an error (it built nothing, or crashed in a table
    lookup: kbit_gemm --bits 7 raised KeyError), naming the accepted values."""
    rc, out, err = cli("prewarm", *args, "--arch", "sm_90a", "--check")
    assert rc == 2 and err.startswith("kernelgen: error: ") and message in err, err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("args, message", [
    (["--arch", ""], "--arch '': an empty list"),
    (["--arch", ","], "--arch ',': an empty list"),
    (["--family", "", "--arch", "sm_90a"], "--family '': an empty list"),
    (["--bits", "", "--arch", "sm_90a"], "--bits '': an empty list"),
    (["--dtypes", ",", "--arch", "sm_90a"], "--dtypes ',': an empty list"),
    (["--family", "mx_gemm", "--arch", "sm_80"], "family mx_gemm: nothing to build for sm_80: it has kernels for sm_89, sm_90a"),
])
def test_empty_lists_and_empty_families_are_usage_errors(cache_dir, cli, args, message, monkeypatch):
    """`--arch ''` once fell back to the default target and built all of it; a family named for
    a target it has no kernels for built nothing and --check passed. (Every family now has
    sm_80 kernels: mx_gemm is given a target list without it, as before session 31.)"""
    import dataclasses

    fam = registry.families()["mx_gemm"]
    monkeypatch.setitem(registry._FAMILIES, "mx_gemm", dataclasses.replace(
        fam, archs=tuple(a for a in ALL_ARCHS if a != "sm_80"),
        prewarm_configs=lambda archs, spec: fam.prewarm_configs([a for a in archs if a != "sm_80"], spec)))
    rc, out, err = cli("prewarm", *args, "--check")
    assert rc == 2 and message in err and out == "", err


def test_a_profile_spec_that_selects_nothing_is_a_usage_error(cache_dir, cli, tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"archs": ["sm_103a"], "families": {"mx_gemm": {"formats": [["mxfp4", "mxfp4"]]}}}))
    rc, _, err = cli("prewarm", "--profile", prof, "--check")
    assert rc == 2 and "its spec {\"formats\": [[\"mxfp4\", \"mxfp4\"]]} selects none" in err, err
    # a shared flag that skips a family with its own spec is not the spec's fault (mx_gemm has
    # no float32 output; kbit takes float32)
    prof.write_text(json.dumps({"archs": ["sm_90a"], "families": {
        "kbit": {}, "mx_gemm": {"formats": [["mxfp8_e4m3", "mxfp8_e4m3"]]}}}))
    rc, _, err = cli("prewarm", "--profile", prof, "--check", "--dtypes", "float32")
    assert rc == 1 and err == "", err
    prof.write_text(json.dumps({"archs": [], "families": {}}))
    rc, _, err = cli("prewarm", "--profile", prof, "--check")
    assert rc == 2 and "non-empty list" in err, err


def test_spec_value_some_family_takes_is_skipped_by_the_others(cache_dir, cli):
    rc, out, err = cli("prewarm", "--family", "kbit,moe", "--bits", "5", "--dtypes", "float32",
                       "--arch", "sm_90a", "--check", "--json")
    assert rc == 1 and err == ""  # kbit builds 5 bits / float32; moe takes neither and skips them
    missing = json.loads(out)["missing"]
    assert missing and all(c["family"] == "kbit" for c in missing)


@pytest.mark.parametrize("spec, message", [
    ({"fp4_gemm": {"fmts": ["nvfp5"]}}, "families.fp4_gemm.fmts: nvfp5: not accepted by fp4_gemm"),
    ({"mx_gemm": {"formats": [["foo", "bar"]]}}, 'families.mx_gemm.formats: ["foo", "bar"]: not accepted'),
    ({"kbit_gemm": {"bits": [7]}}, "families.kbit_gemm.bits: 7: not accepted"),
    ({"kbit": {"bits": [4]}, "moe": {"bits": [5]}}, "families.moe.bits: 5: not accepted by moe"),
    ({"kbit": {"bitz": [4]}}, "families.kbit: unknown key 'bitz'; kbit reads bits, dtypes"),
    ({"mx": {"fmts": [{"a": 1}]}}, "families.mx.fmts: {'a': 1}: not accepted"),
])
def test_profile_spec_keys_and_values_are_checked(cache_dir, cli, tmp_path, spec, message):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"archs": ["sm_90a"], "families": spec}))
    rc, _, err = cli("prewarm", "--profile", prof, "--check")
    assert rc == 2 and message in err, err


def test_every_family_declares_the_spec_it_reads():
    """Family.spec_keys is what prewarm checks a spec against: the builtin families declare it,
    and it takes their matrix specs."""
    for name, fam in registry.families().items():
        assert fam.spec_keys is not None, name
        for key, vals in (fam.matrix_spec or {}).items():
            allowed = fam.spec_keys[key]
            assert allowed is None or set(vals) <= set(allowed), (name, key)
