"""Jinja rendering of kernel templates, and collection of the project headers they include.

Templates are thin (a few `constexpr`/`using` lines and the extern "C" entry points); the logic
lives in `templates/common/*.cuh` and `templates/<family>/*.cuh`, which are real headers. Every
project header reached through `#include "..."` is collected with its content, so that the cache
key covers it and NVRTC compiles exactly the bytes that were hashed (headers are handed to NVRTC
in memory; no absolute path enters the key or the compile).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .. import knobs
from .config import KernelConfig

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def templates_dir() -> Path:
    """KERNELGEN_TEMPLATES_DIR, else `templates/` of a checkout / editable install, else the
    copy shipped in the wheel."""
    override = knobs.templates_dir()
    return override if override is not None else _default_templates_dir()


@functools.lru_cache(maxsize=1)
def _default_templates_dir() -> Path:
    here = Path(__file__).resolve()
    for cand in (here.parents[2] / "templates", here.parents[1] / "_templates"):
        if (cand / "common").is_dir():
            return cand
    raise FileNotFoundError(f"kernelgen templates not found next to {here.parents[1]}")


@functools.lru_cache(maxsize=4)
def _env(root: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@dataclass(frozen=True)
class Rendered:
    name: str  # the template path, used as the NVRTC program name
    source: str
    headers: tuple[tuple[str, str], ...]  # (include name, content), sorted by name

    def header_digests(self) -> dict[str, str]:
        return {n: hashlib.sha256(c.encode()).hexdigest() for n, c in self.headers}

    def source_digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


def _read_header(root: Path, name: str) -> str:
    st = (root / name).stat()
    return _read_header_cached(root / name, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=512)
def _read_header_cached(path: Path, _mtime: int, _size: int) -> str:
    return path.read_text()


def collect_headers(source: str) -> tuple[tuple[str, str], ...]:
    """All project headers reachable from `source` by quoted includes (transitively).

    Names are relative to templates/; a quoted include that is not a project file (none today)
    is left for NVRTC's include path.
    """
    found: dict[str, str] = {}
    todo = list(_INCLUDE.findall(source))
    root = templates_dir()
    while todo:
        name = todo.pop()
        if name in found or not (root / name).is_file():
            continue
        text = _read_header(root, name)
        found[name] = text
        todo.extend(_INCLUDE.findall(text))
    return tuple(sorted(found.items()))


def render(config: KernelConfig) -> Rendered:
    template = _env(templates_dir()).get_template(config.template)
    source = template.render(**config.template_vars())
    return Rendered(config.template, source, collect_headers(source))
