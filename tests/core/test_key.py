"""Cache-key sensitivity: every input of the binary changes the key, nothing else does.

The Triton recipe: a no-op edit keeps the key, a dependency edit changes it, an edit of a file
the kernel does not depend on keeps it. Templates are edited in a private copy
(KERNELGEN_TEMPLATES_DIR), so the checkout is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kernelgen.arch import ALL_ARCHS
from kernelgen.core import cache, compile, jit, render
from kernelgen.core.cache import key_of
from kernelgen.core.jit import key_parts
from kernelgen.core.registry import families
from kernelgen.kbit.config import E4M4Config, KbitDequantizeConfig, KbitQuantizeConfig

E4M4 = E4M4Config(arch="sm_90a")
QUANT = KbitQuantizeConfig(arch="sm_90a", bits=3, dtype="bfloat16")


def key(cfg) -> str:
    return key_of(key_parts(cfg)[0])


def changed_fields(a: dict, b: dict) -> set[str]:
    return {f for f in set(a) | set(b) if a.get(f) != b.get(f)}


@pytest.mark.parametrize("cfg", [E4M4, QUANT], ids=lambda c: c.short())
def test_same_config_same_key(cfg, templates_copy):
    twin = type(cfg)(**{k: v for k, v in cfg.as_dict().items() if k not in ("family", "kind")})
    assert twin is not cfg
    assert key(cfg) == key(twin) == key(cfg), cfg
    # and the same key without the private templates copy: the key does not depend on where
    # the templates live, only on what they contain
    k_copy = key(cfg)
    os.environ.pop("KERNELGEN_TEMPLATES_DIR")
    assert key(cfg) == k_copy, f"{cfg}: key depends on the templates location"


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _touch_later(path: Path, text: str) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


# (config, file under templates/, edit, key must change)
EDITS = [
    # the template itself
    (E4M4, "kbit/absmax.cu.jinja", _append, "\n// edited\n", True),
    (QUANT, "kbit/quantize.cu.jinja", _append, "\n// edited\n", True),
    # a Jinja comment does not reach the rendered source: no-op
    (E4M4, "kbit/absmax.cu.jinja", _append, "{# only a template comment #}", False),
    # headers included directly and transitively
    (E4M4, "common/e4m4.cuh", _append, "\n// edited\n", True),
    (E4M4, "common/dtypes.cuh", _append, "\n// edited\n", True),  # absmax -> e4m4 -> dtypes
    (QUANT, "kbit/kbit.cuh", _append, "\n// edited\n", True),
    (QUANT, "common/e4m4.cuh", _append, "\n// edited\n", True),  # quantize -> kbit -> e4m4
    # a header the kernel does not include
    (E4M4, "kbit/kbit.cuh", _append, "\n// edited\n", False),
    # another family member's template
    (E4M4, "kbit/quantize.cu.jinja", _append, "\n// edited\n", False),
    (QUANT, "kbit/dequantize.cu.jinja", _append, "\n// edited\n", False),
    # a new mtime with the same content
    (E4M4, "common/e4m4.cuh", _touch_later, "", False),
    (QUANT, "kbit/kbit.cuh", _touch_later, "", False),
    (QUANT, "kbit/quantize.cu.jinja", _touch_later, "", False),
]


@pytest.mark.parametrize(
    "cfg, name, edit, text, changes", EDITS,
    ids=[f"{c.short()}-{n}-{e.__name__}-{'changes' if ch else 'keeps'}"
         for c, n, e, _, ch in EDITS])
def test_template_edit(cfg, name, edit, text, changes, templates_copy):
    before_parts, before = key_parts(cfg)
    assert key(cfg) == key_of(before_parts), f"{cfg}: rendering again changed the key"
    edit(templates_copy / name, text)
    after_parts, after = key_parts(cfg)
    what = f"{cfg} after {edit.__name__} of {name}"
    if changes:
        assert key_of(after_parts) != key_of(before_parts), f"{what}: key did not change"
        want = {"source_sha256"} if name.endswith(".jinja") else {"headers"}
        assert changed_fields(before_parts, after_parts) == want, what
        if want == {"headers"}:
            diff = {h for h in before_parts["headers"]
                    if before_parts["headers"][h] != after_parts["headers"][h]}
            assert diff == {name}, f"{what}: headers that changed: {diff}"
            # what NVRTC compiles is what was hashed
            assert dict(after.headers)[name].endswith(text), what
    else:
        assert key_of(after_parts) == key_of(before_parts), f"{what}: key changed"
        assert after == before, what


def test_same_size_header_edit_changes_key(templates_copy):
    """An edit that keeps the file's size (one character replaced) is still seen."""
    path = templates_copy / "common" / "e4m4.cuh"
    k0 = key(E4M4)
    text = path.read_text()
    assert "bias 11" in text
    path.write_text(text.replace("bias 11", "bias 12", 1))
    assert path.stat().st_size == len(text.encode())
    assert key(E4M4) != k0, "same-size edit of common/e4m4.cuh was not seen"


def test_headers_are_the_transitive_includes(templates_copy):
    # absmax.cu.jinja includes e4m4.cuh and ptx.cuh (grid_dependency_wait); both include dtypes.cuh
    assert [n for n, _ in render.render(E4M4).headers] == ["common/dtypes.cuh", "common/e4m4.cuh",
                                                           "common/ptx.cuh"]
    quant = {n for n, _ in render.render(QUANT).headers}
    assert quant >= {"common/dtypes.cuh", "common/e4m4.cuh", "kbit/kbit.cuh"}, quant
    # a new include in a header is followed
    (templates_copy / "common" / "extra.cuh").write_text("#pragma once\n// new\n")
    _append(templates_copy / "common" / "e4m4.cuh", '\n#include "common/extra.cuh"\n')
    parts, rendered = key_parts(E4M4)
    assert "common/extra.cuh" in parts["headers"], parts["headers"]


def _base_options(mp):
    mp.setattr(compile, "BASE_OPTIONS", (*compile.BASE_OPTIONS, "-DKERNELGEN_TEST_EXTRA=1"))


def _base_options_order(mp):
    mp.setattr(compile, "BASE_OPTIONS", tuple(reversed(compile.BASE_OPTIONS)))


def _package_version(mp):
    mp.setattr(cache, "__version__", cache.__version__ + ".post1")


def _nvrtc_version(mp):
    # jit imports nvrtc_version by name: that is the binding key_parts calls
    assert jit.nvrtc_version is compile.nvrtc_version
    mp.setattr(jit, "nvrtc_version", lambda: "99.9")


def _schema(mp):
    mp.setattr(cache, "SCHEMA_VERSION", cache.SCHEMA_VERSION + 1)


PERTURB = [
    (_base_options, {"options"}),
    (_base_options_order, {"options"}),
    (_package_version, {"package_version"}),
    (_nvrtc_version, {"nvrtc"}),
    (_schema, {"schema"}),
]


@pytest.mark.parametrize("cfg", [E4M4, QUANT], ids=lambda c: c.short())
@pytest.mark.parametrize("perturb, fields", PERTURB, ids=[p.__name__.strip("_") for p, _ in PERTURB])
def test_toolchain_changes_key(cfg, perturb, fields, monkeypatch):
    before = key_parts(cfg)[0]
    perturb(monkeypatch)
    after = key_parts(cfg)[0]
    assert key_of(after) != key_of(before), f"{cfg}: {perturb.__name__} kept the key"
    assert changed_fields(before, after) == fields, f"{cfg}: {perturb.__name__}"
    monkeypatch.undo()
    assert key_of(key_parts(cfg)[0]) == key_of(before), f"{cfg}: key not restored"


ARCH_PAIRS = [(a, b) for i, a in enumerate(ALL_ARCHS) for b in ALL_ARCHS[i + 1:]]


@pytest.mark.parametrize("a, b", ARCH_PAIRS)
def test_arch_changes_key(a, b):
    pa, pb = key_parts(E4M4.replace(arch=a))[0], key_parts(E4M4.replace(arch=b))[0]
    assert key_of(pa) != key_of(pb), f"E4M4Config arch {a} vs {b}: same key"
    assert changed_fields(pa, pb) == {"arch", "config", "options"}, (a, b)


@pytest.mark.parametrize(
    "cfg, change",
    [
        (QUANT, {"bits": 4}),
        (QUANT, {"dtype": "float16"}),
        (KbitDequantizeConfig(arch="sm_80"), {"absmax_dtype": "float32"}),
    ],
    ids=lambda v: v.short() if hasattr(v, "short") else json.dumps(v),
)
def test_config_field_changes_key(cfg, change):
    other = cfg.replace(**change)
    assert key(cfg) != key(other), f"{cfg} vs {other}: same key"


def test_all_prewarm_keys_distinct():
    cfgs = [c for f in families().values() for c in f.prewarm_configs(ALL_ARCHS, {})]
    keys = {key(c) for c in cfgs}
    assert len(keys) == len(set(cfgs)), "two configs share a cache key"


def _strings(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


@pytest.mark.parametrize("cfg", list(families()["kbit"].prewarm_configs(["sm_90a"], {})),
                         ids=lambda c: c.short())
def test_parts_hold_no_absolute_path(cfg, templates_copy, tmp_path):
    parts = key_parts(cfg)[0]
    blob = json.dumps(parts)
    forbidden = [str(tmp_path), "/work", str(Path.home()), str(compile.cuda_include_dir()),
                 str(templates_copy), str(Path(render.__file__).parents[2])]
    for bad in forbidden:
        assert bad not in blob, f"{cfg}: manifest parts contain {bad!r}"
    absolute = [s for s in _strings(parts) if os.path.isabs(s) or s.startswith("-I")]
    assert not absolute, f"{cfg}: absolute paths in the parts: {absolute}"


def test_moved_cache_still_hits(cache_env, tmp_path, monkeypatch):
    first = jit.build(E4M4)
    assert first.compiled, "fresh cache did not compile"
    assert jit.build(E4M4).compiled is False
    moved = tmp_path / "elsewhere" / "kernels"
    moved.parent.mkdir()
    shutil.move(str(cache_env), str(moved))
    assert not cache_env.exists()
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(moved))
    again = jit.build(E4M4)
    assert again.compiled is False, "moved cache missed"
    assert again.key == first.key and again.cubin == first.cubin
    assert again.entry.path.is_relative_to(moved), again.entry.path
    assert not cache_env.exists(), "the old location was recreated"
