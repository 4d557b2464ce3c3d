"""What the swizzled scale layout costs the quantize kernels: NVFP4 (gs given) and MXFP4 at
M = K = 4096, fp16, swizzled against row-major scales, graph replays over 4 rotated inputs.

    python examples/probe_mx_scale_layout.py
"""

import cupy
import numpy as np

import kernelgen as kg
from kernelgen.bench import graph_time


def main() -> None:
    stream = cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    with stream:
        xs = [cupy.asarray(rng.standard_normal((4096, 4096)).astype(np.float16)) for _ in range(4)]
        for fmt in ("nvfp4", "mxfp4"):
            for layout in ("swizzled", "row_major"):
                if fmt == "nvfp4":
                    def call(i, layout=layout):
                        return kg.quantize_nvfp4(xs[i % 4], 1.0, scale_layout=layout)
                else:
                    def call(i, layout=layout, fmt=fmt):
                        return kg.quantize_mx(xs[i % 4], fmt, scale_layout=layout)
                t, mode = graph_time(call, 8, stream)
                print(f"{fmt:6s} {layout:9s} {t * 1e6:7.2f} us [{mode}]", flush=True)


if __name__ == "__main__":
    main()
