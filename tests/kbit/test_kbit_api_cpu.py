"""kbit API checks that need no GPU: rejection before any launch."""

import numpy as np
import pytest

import kernelgen as kg


def test_bits_rejected_first():
    with pytest.raises(ValueError, match=r"bits=7: kbit supports bits in 2\.\.5"):
        kg.quantize_kbit(np.ones(32, np.float16), 7)


def test_host_array_rejected():
    with pytest.raises(ValueError, match="NumPy arrays live on the host"):
        kg.quantize_kbit(np.ones(32, np.float16), 4)


def test_dequantize_needs_kbit_tensor():
    with pytest.raises(ValueError, match="expected a KbitTensor"):
        kg.dequantize_kbit(np.ones(4, np.uint32))
