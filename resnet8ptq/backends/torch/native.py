"""The runtime form of a uint8/int8 program: inductor's oneDNN int8 kernels, checked to cover every layer."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import fx

from resnet8ptq.backends.base import Predictor
from resnet8ptq.backends.torch.convert import PREDICT_BATCH
from resnet8ptq.backends.torch.private_api import clear_inductor_counters, freezing, inductor_int8_prepacks
from resnet8ptq.backends.torch.program import count_targets


class NativeUnavailable(RuntimeError):
    """Inductor did not turn the quantized model into integer kernels (after ``seconds`` of trying)."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


def compile_native(module: fx.GraphModule, input_shape: tuple[int, ...]) -> tuple[Predictor, float, str]:
    """torch.compile (inductor, freezing) the converted model for batches of PREDICT_BATCH images.

    Returns the predictor, the compile seconds and what was lowered. Raises NativeUnavailable unless inductor
    packed every conv and linear weight for a oneDNN int8 kernel.
    """
    aten = torch.ops.aten
    expected = (count_targets(module, aten.conv2d.default), count_targets(module, aten.linear.default))
    torch.compiler.reset()  # a fresh cache: no recompile limit reached across many quantize() calls
    clear_inductor_counters()
    start = time.perf_counter()
    compiled = torch.compile(module, dynamic=False)
    with freezing(), torch.inference_mode():
        try:
            compiled(torch.zeros((PREDICT_BATCH, *input_shape)))
        except Exception as err:  # inductor raises many types when a kernel refuses a dtype
            message = f"inductor failed: {type(err).__name__}: {str(err)[:200]}"
            raise NativeUnavailable(message, time.perf_counter() - start) from err
    seconds = time.perf_counter() - start
    packed = inductor_int8_prepacks()
    lowered = f"{packed[0]}/{expected[0]} conv and {packed[1]}/{expected[1]} linear layers"
    if packed != expected:
        raise NativeUnavailable(f"inductor lowered {lowered} to int8 kernels", seconds)
    with freezing(), torch.inference_mode():
        compiled(torch.zeros((1, *input_shape)))  # a second specialisation, for single-image latency
    return _padded_predictor(compiled, input_shape), time.perf_counter() - start, lowered


def _padded_predictor(compiled: Any, input_shape: tuple[int, ...]) -> Predictor:
    """Feed the compiled model single images or fixed PREDICT_BATCH batches (zero-padded), the two shapes
    it was compiled for, so it never recompiles."""

    def predict(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=np.float32)
        outputs = []
        with freezing(), torch.inference_mode():
            if len(images) == 1:
                return compiled(torch.from_numpy(images)).numpy()
            for start in range(0, len(images), PREDICT_BATCH):
                chunk = images[start : start + PREDICT_BATCH]
                batch = torch.zeros((PREDICT_BATCH, *input_shape))
                batch[: len(chunk)] = torch.from_numpy(chunk)
                outputs.append(compiled(batch)[: len(chunk)].numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 10), np.float32)

    return predict
