"""A .tflite model run by the LiteRT interpreter on float images, in either of its two forms.

Self-contained (numpy and ``ai_edge_litert`` only): the MLflow pyfunc ships this file as code, so a logged
model loads without this project.

- ``reference=True``: LiteRT's reference kernels (``OpResolverType.BUILTIN_REF``), the integer arithmetic
  TFLite specifies for quantized ops (int32 accumulation, fixed-point requantization), the same on every CPU;
- ``reference=False``: what LiteRT deploys by default: its optimized kernels, with the XNNPACK delegate taking
  the ops it supports.

Integer inputs are quantized as TFLite's QUANTIZE op does (``round(x / scale) + zero_point``, rounding half
away from zero, clamped to the type), integer outputs dequantized (``(q - zero_point) * scale``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from resnet8ptq.hardware import usable_cores

BATCH = 500  # images per invoke: bounds the activation memory of large inputs


def quantize(values: np.ndarray, scale: float, zero_point: int, dtype: np.dtype) -> np.ndarray:
    """Float values to the integer type as TFLite's QUANTIZE op (float32 division, std::round, clamp)."""
    scaled = np.asarray(values, np.float32) / np.float32(scale)
    rounded = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))
    info = np.iinfo(dtype)
    return np.clip(rounded + zero_point, info.min, info.max).astype(dtype)


def dequantize(values: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """Integer values to float32 as TFLite's DEQUANTIZE op."""
    return (np.asarray(values, np.int32) - np.int32(zero_point)).astype(np.float32) * np.float32(scale)


class TFLiteRunner:
    """A .tflite model as a predictor: NHWC float32 raw 0-255 images (any batch size) -> outputs (N, ...).

    ``threads``: compute threads (None: every core this process may use). The default kernels take them as
    the interpreter's threads; the reference kernels are single-threaded, so ``threads`` interpreters share
    each batch (``invoke`` releases the GIL). ``preserve_all_tensors``: one interpreter that keeps every
    intermediate tensor readable after :meth:`invoke` (for analysis).
    """

    def __init__(
        self,
        path: str | Path,
        threads: int | None = None,
        reference: bool = False,
        preserve_all_tensors: bool = False,
    ) -> None:
        self.path = Path(path)
        self.reference = reference
        threads = threads or usable_cores()
        copies = threads if reference and not preserve_all_tensors else 1
        self._slots = [
            _Slot(
                Interpreter(
                    model_path=str(path),
                    num_threads=1 if reference else threads,
                    experimental_op_resolver_type=OpResolverType.BUILTIN_REF
                    if reference
                    else OpResolverType.AUTO,
                    experimental_preserve_all_tensors=preserve_all_tensors,
                )
            )
            for _ in range(copies)
        ]
        self.interpreter = self._slots[0].interpreter
        self._pool = ThreadPoolExecutor(copies) if copies > 1 else None

    def invoke(self, images: np.ndarray) -> np.ndarray:
        """Run one batch on :attr:`interpreter`; return the output, dequantized."""
        return self._slots[0].invoke(images)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, np.float32)
        parts = []
        for start in range(0, len(images), BATCH):
            batch = images[start : start + BATCH]
            if self._pool is None or len(batch) < len(self._slots):
                parts.append(self.invoke(batch))
            else:
                shares = np.array_split(batch, len(self._slots))
                parts += list(self._pool.map(_Slot.invoke, self._slots, shares))
        return np.concatenate(parts) if parts else np.zeros((0, 10), np.float32)


class _Slot:
    """One interpreter and the batch size its input is allocated for."""

    def __init__(self, interpreter: Interpreter) -> None:
        self.interpreter = interpreter
        self._input = interpreter.get_input_details()[0]
        self._batch: int | None = None

    def invoke(self, images: np.ndarray) -> np.ndarray:
        """Run one batch (resizing the input when its size changes); return the output, dequantized."""
        if len(images) != self._batch:
            shape = [len(images), *self._input["shape"][1:]]
            self.interpreter.resize_tensor_input(self._input["index"], shape)
            self.interpreter.allocate_tensors()
            self._batch = len(images)
        dtype = self._input["dtype"]
        if dtype != np.float32:
            images = quantize(images, *self._input["quantization"], dtype)
        self.interpreter.set_tensor(self._input["index"], np.ascontiguousarray(images, dtype=dtype))
        self.interpreter.invoke()
        output = self.interpreter.get_output_details()[0]
        values = self.interpreter.get_tensor(output["index"])
        return values if output["dtype"] == np.float32 else dequantize(values, *output["quantization"])
