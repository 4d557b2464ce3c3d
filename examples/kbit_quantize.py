"""kbit format example: quantize a weight to 2..5 bits, dequantize, measure the error, repack.

    python examples/kbit_quantize.py            # needs a CUDA GPU
"""

import cupy
import numpy as np

import kernelgen as kg


def main() -> None:
    w = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    for bits in (2, 3, 4, 5):
        q = kg.quantize_kbit(w, bits)  # packed bit planes + E4M4 scale per 32 elements
        w_hat = kg.dequantize_kbit(q)  # back to fp16
        x, y = cupy.asnumpy(w).astype(np.float64), cupy.asnumpy(w_hat).astype(np.float64)
        sqnr = 10 * np.log10(np.sum(x * x) / np.sum((x - y) ** 2))
        bytes_per_w = (q.packed.nbytes + q.absmax.nbytes) / w.size
        print(f"{bits} bits: {bytes_per_w * 8:.3f} bits/weight stored, SQNR {sqnr:.1f} dB")
    tiled = kg.repack_kbit(q)  # tiles [K/64][N/128][128][2][bits] for other GEMM kernels
    # (kernelgen's own gemm takes kg.quantize_weight(w, bits): README, Quick start)
    print(f"repacked {tiled.n}x{tiled.k} weight to tiles of {tiled.tile_n}x{tiled.tile_k}")


if __name__ == "__main__":
    main()
