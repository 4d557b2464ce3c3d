"""The `kernelgen` entry point: `python -m cache_tools`, exit codes, errors without tracebacks,
help, doctor."""

from __future__ import annotations

import json

from .conftest import run_module


def test_usage_errors_exit_2_without_traceback(cache_dir):
    for args in (["prewarm", "--family", "nope"], ["prewarm", "--arch", "sm_1"], ["cache", "purge"],
                 ["cache", "gc", "--older-than", "soon"], ["no-such-command"]):
        res = run_module(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert "kernelgen: error:" in res.stderr or "error:" in res.stderr
        assert "Traceback" not in res.stderr


def test_help_and_version(cli):
    rc, out, _ = cli("--version")
    assert rc == 0 and out.startswith("kernelgen ")
    rc, out, _ = cli("prewarm", "--help")
    assert rc == 0 and '"families"' in out and "--check" in out  # the profile format is documented
    for sub in ("ls", "info", "show", "explain", "verify", "gc", "purge", "export", "import"):
        assert cli("cache", sub, "--help")[0] == 0


def test_doctor(cache_dir, cli):
    rc, out, _ = cli("doctor")
    assert rc == 0, out
    assert "nvrtc" in out and "test compile" in out and "KERNELGEN_CACHE_DIR" in out
    assert str(cache_dir) in out
    report = json.loads(cli("doctor", "--json")[1])
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["nvrtc"]["ok"] and checks["cuda headers"]["ok"] and checks["test compile"]["ok"]
    assert not (cache_dir / "v1").exists() or not any((cache_dir / "v1").glob("??/*"))  # no entry


def test_doctor_fails_without_headers(cache_dir, cli, monkeypatch):
    from kernelgen.core import compile as compile_mod
    from kernelgen.errors import KernelgenError

    def missing():
        raise KernelgenError("CUDA headers (cuda_fp16.h) not found")

    monkeypatch.setattr(compile_mod, "cuda_include_dir", missing)
    rc, out, err = cli("doctor")
    assert rc == 1 and "FAIL" in out and "cuda_fp16.h" in out and "cannot build" in err


def test_a_reader_that_leaves_is_not_an_error(warm_cache):
    """`kernelgen cache ls --json | head -2`: the pipe closes before the output is written; the
    command exits with its own code (0) without a message (BrokenPipeError was caught as an
    OSError: exit 1, an error)."""
    import subprocess
    import sys

    from .conftest import REPO

    for args in (["cache", "ls", "--json"], ["cache", "ls"], ["cache", "info"]):
        proc = subprocess.Popen([sys.executable, "-m", "cache_tools", *args], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # the reader left before the command printed anything
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0 and err == "", (args, err)


def test_prewarm_whose_progress_reader_leaves_builds_everything(cache_dir):
    """`kernelgen prewarm -j 2 2>&1 | head -1`: the progress lines on stderr lose their reader
    after the first; the prewarm still builds every config and exits 0 (a broken pipe once
    stopped the pool after one config and exited 0 silently)."""
    import subprocess
    import sys

    from .conftest import PREWARM_ARGS, PREWARM_CONFIGS, REPO

    proc = subprocess.Popen([sys.executable, "-m", "cache_tools", "prewarm", *PREWARM_ARGS,
                             "-j", "2"], cwd=REPO, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    proc.stderr.readline()
    proc.stderr.close()  # the reader left after one line
    assert proc.wait(timeout=300) == 0
    check = subprocess.run([sys.executable, "-m", "cache_tools", "prewarm", *PREWARM_ARGS,
                            "--check"], cwd=REPO, text=True, capture_output=True)
    assert check.returncode == 0 and f"{len(PREWARM_CONFIGS)} cached, 0 missing" in check.stdout, \
        check.stdout + check.stderr
