"""mx: block-scaled narrow floating-point formats (NVFP4, MXFP4, MXFP6, MXFP8).

Only the NumPy reference exists so far (`kernelgen.mx.reference`); it defines the formats bit for
bit - element codes, packing, E4M3 / E8M0 scale bytes and the block-scaled swizzled scale
layout - so that the CUDA kernels, when they come, can be tested against it. No family is
registered yet because there are no kernels.
"""
