"""LiteRT's reference kernels (``BUILTIN_REF``) as the integer device's exact reference: every listed tensor
of a .tflite model, kept with ``experimental_preserve_all_tensors``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from resnet8ptq.backends.tflite.litert_runner import quantize


def reference_layers(path: Path, images: np.ndarray, outputs: list[str]) -> dict[str, np.ndarray]:
    """Every listed tensor of a .tflite model on LiteRT's reference kernels (NCHW for 4-D tensors)."""
    interpreter = Interpreter(
        model_path=str(path),
        experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
        experimental_preserve_all_tensors=True,
    )
    detail = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(detail["index"], images.shape)
    interpreter.allocate_tensors()
    if detail["dtype"] != np.float32:
        images = quantize(images, *detail["quantization"], detail["dtype"])
    interpreter.set_tensor(detail["index"], images)
    interpreter.invoke()
    tensors = {name: interpreter.get_tensor(int(name)) for name in outputs}
    return {name: t.transpose(0, 3, 1, 2) if t.ndim == 4 else t for name, t in tensors.items()}
