"""Fixtures of the core pipeline tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture
def templates_copy(tmp_path, monkeypatch) -> Path:
    """A private copy of templates/ that KERNELGEN_TEMPLATES_DIR points at; edit it freely."""
    from kernelgen.core import render

    monkeypatch.delenv("KERNELGEN_TEMPLATES_DIR", raising=False)
    dst = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), dst)
    monkeypatch.setenv("KERNELGEN_TEMPLATES_DIR", str(dst))
    return dst
