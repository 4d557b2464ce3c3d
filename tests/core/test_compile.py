"""Render + NVRTC without a cache: errors carry what is needed to fix them, logs parse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jinja2
import pytest

from kernelgen.core import jit
from kernelgen.core.compile import compile_cubin, resource_summary
from kernelgen.core.config import KernelConfig
from kernelgen.core.render import render
from kernelgen.errors import CompileError
from kernelgen.kbit.config import E4M4Config, KbitDequantizeConfig, KbitQuantizeConfig

GOOD = """// test kernel
#include "common/dtypes.cuh"

extern "C" __global__ void k(float* out) {
  out[threadIdx.x] = kg::to_float<float>({{ value }});
}
"""

# line 5 of the rendered source is the broken one
BROKEN = """// test kernel
#include "common/dtypes.cuh"

extern "C" __global__ void k(float* out) {
  out[threadIdx.x] = kg::no_such_function_{{ value }}(1.0f);
}
"""

UNDEFINED = """// test kernel
extern "C" __global__ void k(float* out) { out[0] = {{ value }} + {{ not_a_field }}; }
"""


@dataclass(frozen=True)
class _TestConfig(KernelConfig):
    """Test-only family whose template is `test/<name>.cu.jinja` in the private templates copy."""

    family: ClassVar[str] = "test"
    template: ClassVar[str] = "test/kernel.cu.jinja"
    value: int = 1

    def symbols(self) -> tuple[str, ...]:
        return ("k",)


def _write(templates, text: str) -> None:
    (templates / "test").mkdir(exist_ok=True)
    (templates / "test" / "kernel.cu.jinja").write_text(text)


def test_good_test_template_compiles(templates_copy):
    """Control for the failures below: the same harness with a correct template compiles."""
    _write(templates_copy, GOOD)
    cfg = _TestConfig(arch="sm_80", value=3)
    rendered = render(cfg)
    assert "kg::to_float<float>(3)" in rendered.source
    assert [n for n, _ in rendered.headers] == ["common/dtypes.cuh"]
    out = compile_cubin(cfg, rendered)
    assert out.cubin.startswith(b"\x7fELF"), cfg


@pytest.mark.parametrize("arch", ["sm_80", "sm_120a"])
def test_compile_error_carries_config_log_source(arch, templates_copy):
    _write(templates_copy, BROKEN)
    cfg = _TestConfig(arch=arch, value=7)
    rendered = render(cfg)
    with pytest.raises(CompileError) as exc:
        compile_cubin(cfg, rendered)
    err = exc.value
    assert err.config is cfg
    assert err.source == rendered.source
    # NVRTC names the program (the template path) and the line: "test/kernel.cu.jinja(5): error"
    assert "test/kernel.cu.jinja(5)" in err.log, f"{cfg}: log lacks the error line:\n{err.log}"
    assert "no_such_function_7" in err.log, err.log
    numbered = err.numbered_source().splitlines()
    assert numbered[4].startswith("5 | ") and "no_such_function_7" in numbered[4], numbered
    assert len(numbered) == len(rendered.source.splitlines())
    msg = str(err)
    assert repr(cfg) in msg and f"--gpu-architecture={arch}" in msg and "no_such_function_7" in msg
    assert f"--gpu-architecture={arch}" in err.options


def test_compile_error_through_build(templates_copy, cache_env):
    """build() lets the CompileError through and publishes nothing."""
    _write(templates_copy, BROKEN)
    cfg = _TestConfig(arch="sm_90a")
    with pytest.raises(CompileError) as exc:
        jit.build(cfg)
    assert exc.value.config == cfg
    cache = jit.default_cache()
    assert list(cache.entries()) == [], "a failed compile left an entry"
    assert list((cache_env / "v1" / "tmp").iterdir()) == [], "a failed compile left a folder"


def test_compile_error_dump(templates_copy, capsys):
    _write(templates_copy, BROKEN)
    cfg = _TestConfig(arch="sm_90a")
    with pytest.raises(CompileError) as exc:
        compile_cubin(cfg, render(cfg))
    exc.value.dump()
    err = capsys.readouterr().err
    assert "--- log ---" in err and "5 | " in err and "no_such_function_1" in err


def test_undefined_variable_raises_at_render(templates_copy):
    _write(templates_copy, UNDEFINED)
    cfg = _TestConfig(arch="sm_90a")
    with pytest.raises(jinja2.UndefinedError, match="not_a_field"):
        render(cfg)


def test_missing_template(templates_copy):
    cfg = _TestConfig(arch="sm_90a")  # test/kernel.cu.jinja not written
    with pytest.raises(jinja2.TemplateNotFound, match="test/kernel.cu.jinja"):
        render(cfg)


@pytest.mark.parametrize(
    "cfg",
    [E4M4Config(arch="sm_90a"), KbitQuantizeConfig(arch="sm_80", bits=5, dtype="bfloat16"),
     KbitDequantizeConfig(arch="sm_120a", bits=3, dtype="float32", absmax_dtype="float16")],
    ids=lambda c: c.short(),
)
def test_resource_summary_of_real_log(cfg):
    out = compile_cubin(cfg, render(cfg))
    res = resource_summary(out.log)
    assert res["registers"] > 0, f"{cfg}: {res}\n{out.log}"
    assert res["spill_bytes"] == 0, f"{cfg}: {res}\n{out.log}"
    # one "Used N registers" line per kernel the config defines
    assert out.log.count("Used ") == len(cfg.symbols()), f"{cfg}:\n{out.log}"
    for sym in cfg.symbols():
        assert f"'{sym}'" in out.log, f"{cfg}: {sym} not in the ptxas report"


def test_resource_summary_parse():
    log = (
        "ptxas info    : Function properties for a\n"
        "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers\n"
        "ptxas info    : Function properties for b\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 0 barriers, 4096 bytes smem, 400 bytes cmem[0]\n"
    )
    assert resource_summary(log) == {"registers": 255, "spill_bytes": 32, "static_smem": 4096}
    assert resource_summary("") == {"registers": None, "spill_bytes": None, "static_smem": None}


def test_cubin_is_whole_elf():
    """The image ends where its ELF tables say (CuPy's getCUBIN drops the last byte)."""
    import struct

    from kernelgen.kbit.config import KbitDequantizeConfig

    cfg = KbitDequantizeConfig(arch="sm_90a")
    c = compile_cubin(cfg, render(cfg)).cubin
    shoff, = struct.unpack_from("<Q", c, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", c, 0x3A)
    phoff, = struct.unpack_from("<Q", c, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", c, 0x36)
    assert len(c) >= max(shoff + shentsize * shnum, phoff + phentsize * phnum)
