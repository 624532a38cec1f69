"""Editing an ONNX model's constants in place."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def set_initializer(init: onnx.TensorProto, values: np.ndarray) -> None:
    """Overwrite an initializer's values, keeping its name and float32 type."""
    init.CopyFrom(numpy_helper.from_array(np.asarray(values, np.float32), init.name))
