"""The compiled runtime forms of a quantized program: inductor's oneDNN int8 kernels for uint8/int8 (checked
to cover every layer), else the program with its weight dequantization folded, compiled into float kernels."""

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


class CompileFailed(RuntimeError):
    """Inductor did not compile the program as asked (after ``seconds`` of trying)."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


def _compile(module: Any, input_shape: tuple[int, ...], batch: int) -> float:
    """Compile (inductor, freezing) ``module`` (a torch.compile wrapper) for batches of ``batch`` images; the
    seconds it took. Raises CompileFailed with inductor's error."""
    start = time.perf_counter()
    with freezing(), torch.inference_mode():
        try:
            module(torch.zeros((batch, *input_shape)))
        except Exception as err:  # inductor raises many types when a kernel refuses a dtype
            message = f"inductor failed: {type(err).__name__}: {str(err)[:200]}"
            raise CompileFailed(message, time.perf_counter() - start) from err
    return time.perf_counter() - start


def compile_native(module: fx.GraphModule, input_shape: tuple[int, ...]) -> tuple[Predictor, float, str]:
    """The uint8/int8 program compiled into oneDNN int8 kernels: the predictor, the compile seconds and what
    was lowered. Raises CompileFailed unless inductor packed every conv and linear weight for an int8 kernel.
    """
    aten = torch.ops.aten
    expected = (count_targets(module, aten.conv2d.default), count_targets(module, aten.linear.default))
    torch.compiler.reset()  # a fresh cache: no recompile limit reached across many quantize() calls
    clear_inductor_counters()
    compiled = torch.compile(module, dynamic=False)
    seconds = _compile(compiled, input_shape, PREDICT_BATCH)
    packed = inductor_int8_prepacks()  # of this compile only: the second shape packs again
    lowered = f"{packed[0]}/{expected[0]} conv and {packed[1]}/{expected[1]} linear layers"
    if packed != expected:
        raise CompileFailed(f"inductor lowered {lowered} to int8 kernels", seconds)
    seconds += _compile(compiled, input_shape, 1)  # the single-image shape, for latency
    return _padded_predictor(compiled, input_shape), seconds, lowered


def compile_simulated(folded: fx.GraphModule, input_shape: tuple[int, ...]) -> tuple[Predictor, float]:
    """A q/dq program whose weight dequantization is folded (:func:`.program.fold_weight_dequantize`),
    compiled into float kernels with the activation quantize/dequantize fused: the predictor and the
    compile seconds. Raises CompileFailed."""
    torch.compiler.reset()
    compiled = torch.compile(folded, dynamic=False)
    seconds = sum(_compile(compiled, input_shape, batch) for batch in (PREDICT_BATCH, 1))
    return _padded_predictor(compiled, input_shape), seconds


def _padded_predictor(compiled: Any, input_shape: tuple[int, ...]) -> Predictor:
    """Feed the compiled model single images or fixed PREDICT_BATCH batches (zero-padded), the two shapes
    it was compiled for, always in fresh contiguous tensors, so it never recompiles (dynamo also guards on
    strides: numpy's ``image[None]`` has stride 0 on its batch axis, which cost a second compile)."""

    def predict(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=np.float32)
        outputs = []
        with freezing(), torch.inference_mode():
            if len(images) == 1:
                single = torch.zeros((1, *input_shape))
                single[0] = torch.from_numpy(images[0])
                return compiled(single).numpy()
            for start in range(0, len(images), PREDICT_BATCH):
                chunk = images[start : start + PREDICT_BATCH]
                batch = torch.zeros((PREDICT_BATCH, *input_shape))
                batch[: len(chunk)] = torch.from_numpy(chunk)
                outputs.append(compiled(batch)[: len(chunk)].numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 10), np.float32)

    return predict
