"""The mx_gemm headers coexist with the mx codec header in one translation unit (NVRTC, no GPU):
kg::mx (mx/mx.cuh) has the codec types E4M3 / E5M2 / E2M1, kg::mx_gemm (mx_gemm/ops.cuh) the
element-format enum of the GEMM kernels; the same names in one namespace did not compile."""

from dataclasses import dataclass
from typing import ClassVar

import pytest

from kernelgen.core.compile import compile_cubin
from kernelgen.core.config import KernelConfig
from kernelgen.core.render import Rendered, collect_headers

BOTH = """// mx codecs and mx_gemm wrappers in one translation unit
#include "mx/mx.cuh"
#include "mx_gemm/{header}"

extern "C" __global__ void k(const uint16_t* in, float* out) {{
  const uint32_t h = kg::mx_gemm::fp8x2_to_f16x2<kg::mx_gemm::E4M3>(in[threadIdx.x]);
  out[threadIdx.x] = kg::mx::decode<kg::mx::E4M3>(in[threadIdx.x] & 0xFF) + (float)(h & 1) +
                     (float)kg::mx_gemm::E2M1;
}}
"""


@dataclass(frozen=True)
class _HeaderConfig(KernelConfig):
    """Only the arch matters here (compile_cubin reads config.arch)."""

    family: ClassVar[str] = "test"

    def symbols(self) -> tuple[str, ...]:
        return ("k",)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_120a"])
@pytest.mark.parametrize("header", ["ops.cuh", "fp8_mma.cuh", "bs_mma.cuh"])
def test_mx_and_mx_gemm_headers_compile_together(arch, header):
    source = BOTH.format(header=header)
    rendered = Rendered("test/mx_both.cu", source, collect_headers(source))
    names = [n for n, _ in rendered.headers]
    assert "mx/mx.cuh" in names and "mx_gemm/ops.cuh" in names, names
    out = compile_cubin(_HeaderConfig(arch=arch), rendered)
    assert out.cubin.startswith(b"\x7fELF"), out.log
