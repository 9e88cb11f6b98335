"""Writes tests/data/reference.safetensors with the Python `safetensors` package (numpy backend).

tests/engine/safetensors_test.cpp loads the file and checks every value below, so the engine's reader is
tested against the reference writer, not only against itself. Regenerate with:
    pip install safetensors numpy && python3 tests/data/make_reference_safetensors.py
(made with safetensors 0.8.0, numpy 2.4.6). numpy has no bfloat16, so BF16 is covered by round trips only.
"""
import os

import numpy as np
from safetensors.numpy import save_file

tensors = {
    "encoder.layer.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1.0,  # [-1, -0.5, ..., 1.5]
    "encoder.layer.0.bias": np.array([1.0 / 3.0, -2.5, 1e-300], dtype=np.float64),
    "half": np.array([[0.1, -2.0], [65504.0, 6e-8]], dtype=np.float16),
    "ids": np.array([-7, 0, 2**31 - 1], dtype=np.int32),
    "big": np.array([2**40 + 1, -(2**62)], dtype=np.int64),
    "bytes": np.array([0, 1, 255], dtype=np.uint8),
    "mask": np.array([True, False, True, True], dtype=np.bool_),
    "scalar": np.array(3.25, dtype=np.float32),  # shape []
    "empty": np.zeros((0, 3), dtype=np.float32),
    "unicode name \u00e9\u4e2d \"quoted\"": np.array([42.0], dtype=np.float32),
}
metadata = {"format": "np", "made_by": "make_reference_safetensors.py", "escaped": "line\nbreak \"q\" \\"}

here = os.path.dirname(os.path.abspath(__file__))
save_file(tensors, os.path.join(here, "reference.safetensors"), metadata=metadata)
