"""Fixtures of the CLI tests: a fresh cache per test, a prebuilt one to copy, an in-process runner.

No GPU: every build targets an explicit arch (NVRTC compiles cubins without a device).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelgen.core.cache import DiskCache
from kernelgen.core.jit import build
from kernelgen.core.registry import families
from kernelgen.kbit import E4M4Config

# The small prewarm every test uses: kbit, 2 bits, float16, sm_90a.
PREWARM_ARGS = ["--family", "kbit", "--bits", "2", "--dtypes", "float16", "--arch", "sm_90a"]
PREWARM_CONFIGS = list(dict.fromkeys(
    families()["kbit"].prewarm_configs(["sm_90a"], {"bits": [2], "dtypes": ["float16"]})))
# The seeded cache holds those plus one config of another arch, for filter tests.
SEED_CONFIGS = [*PREWARM_CONFIGS, E4M4Config(arch="sm_80")]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """An empty writable cache layer (KERNELGEN_CACHE_DIR), no read-only layers, default knobs."""
    root = tmp_path / "cache"
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(root))
    for name in ("KERNELGEN_CACHE_RO", "KERNELGEN_DISABLE_JIT", "KERNELGEN_CACHE_MAX_BYTES",
                 "KERNELGEN_TEMPLATES_DIR", "KERNELGEN_KEEP_SOURCE", "KERNELGEN_VERBOSE"):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.fixture(scope="session")
def seed_cache(tmp_path_factory) -> Path:
    """SEED_CONFIGS compiled once per session into a layer that tests copy, never change."""
    root = tmp_path_factory.mktemp("seed") / "cache"
    cache = DiskCache(root, readonly=[], max_bytes=0)
    for cfg in SEED_CONFIGS:
        build(cfg, cache=cache)
    return root


@pytest.fixture
def warm_cache(cache_dir, seed_cache) -> Path:
    """`cache_dir` holding a copy of the seeded entries."""
    shutil.copytree(seed_cache, cache_dir)
    return cache_dir


@pytest.fixture
def templates_copy(tmp_path, monkeypatch):
    """A private templates/ (KERNELGEN_TEMPLATES_DIR) that a test may edit."""
    from kernelgen.core import render

    monkeypatch.delenv("KERNELGEN_TEMPLATES_DIR", raising=False)
    dst = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), dst)
    monkeypatch.setenv("KERNELGEN_TEMPLATES_DIR", str(dst))
    return dst


@pytest.fixture
def cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """Run `kernelgen ARGS...` in this process: returns (exit code, stdout, stderr)."""
    from cache_tools.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def run_module(*args: str) -> subprocess.CompletedProcess:
    """`python -m cache_tools ARGS...` in a child process (inherits the test's environment)."""
    return subprocess.run([sys.executable, "-m", "cache_tools", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
