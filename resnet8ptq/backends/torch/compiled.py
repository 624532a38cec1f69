"""The compiled runtime forms of a quantized program: inductor's oneDNN int8 kernels for uint8/int8 (checked
to cover every layer), else the program with its weight dequantization folded, compiled into float kernels."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from resnet8ptq.backends.base import Predictor
from resnet8ptq.backends.torch.convert import PREDICT_BATCH
from resnet8ptq.backends.torch.private_api import (
    clear_inductor_counters,
    freezing,
    inductor_int8_prepacks,
    post_grad_pass,
)
from resnet8ptq.backends.torch.program import count_targets


class CompileFailed(RuntimeError):
    """Inductor did not compile the program as asked (after ``seconds`` of trying)."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


Settings = Callable[[], contextlib.AbstractContextManager]
"""The inductor settings a compiled program is compiled and called under."""


def _compile(module: Any, input_shape: tuple[int, ...], batch: int, settings: Settings) -> float:
    """Compile ``module`` (a torch.compile wrapper) under ``settings`` for batches of ``batch`` images; the
    seconds it took. Raises CompileFailed with inductor's error."""
    start = time.perf_counter()
    with settings(), torch.inference_mode():
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
    seconds = _compile(compiled, input_shape, PREDICT_BATCH, freezing)
    packed = inductor_int8_prepacks()  # of this compile only: the second shape packs again
    lowered = f"{packed[0]}/{expected[0]} conv and {packed[1]}/{expected[1]} linear layers"
    if packed != expected:
        raise CompileFailed(f"inductor lowered {lowered} to int8 kernels", seconds)
    seconds += _compile(compiled, input_shape, 1, freezing)  # the single-image shape, for latency
    return _padded_predictor(compiled, input_shape, freezing), seconds, lowered


def compile_simulated(folded: fx.GraphModule, input_shape: tuple[int, ...]) -> tuple[Predictor, float]:
    """A q/dq program whose weight dequantization is folded (:func:`.program.fold_weight_dequantize`),
    compiled into float kernels with the activation quantize/dequantize fused and computed in float
    (:func:`requantize_in_float`): the predictor and the compile seconds. Raises CompileFailed."""
    torch.compiler.reset()
    compiled = torch.compile(folded, dynamic=False)
    seconds = sum(_compile(compiled, input_shape, batch, _simulated) for batch in (PREDICT_BATCH, 1))
    return _padded_predictor(compiled, input_shape, _simulated), seconds


@contextlib.contextmanager
def _simulated() -> Iterator[None]:
    """Freezing (weights prepacked for oneDNN, convs fused with their ReLU/add) and float requantization."""
    with freezing(), post_grad_pass(requantize_in_float, Path(__file__)):
        yield


FLOAT_EXACT = 1 << 24
"""Integers of magnitude up to 2**24 are exact in float32."""


def requantize_in_float(graph: fx.Graph) -> int:
    """Replace each ``dequantize_per_tensor(quantize_per_tensor(x))`` pair of ``graph`` by its arithmetic in
    float, ``(clamp(round(x * (1 / scale)) + zero_point, qmin, qmax) - zero_point) * scale``: what inductor
    computes for the pair, without converting the clamped whole numbers to the integer type and back (an
    identity for whole numbers inside the type's range, and ~7% of the program's time on AMD EPYC Zen 4).

    An inductor post-grad pass: it must run after freezing's passes, whose binary folding would move the
    ``* (1 / scale)`` into a preceding convolution's weights and so round differently from the reference.
    Returns how many pairs were replaced; any other pair is left as it is."""
    qdq, aten = torch.ops.quantized_decomposed, torch.ops.aten
    replaced = 0
    for dequantize in list(graph.nodes):
        if dequantize.op != "call_function" or dequantize.target != qdq.dequantize_per_tensor.default:
            continue
        quantize = dequantize.args[0]
        if not isinstance(quantize, fx.Node) or quantize.target != qdq.quantize_per_tensor.default:
            continue
        if quantize.kwargs or dequantize.kwargs.get("out_dtype") not in (None, torch.float32):
            continue
        x, scale, zero_point, qmin, qmax, dtype = quantize.args
        if tuple(dequantize.args[1:]) != (scale, zero_point, qmin, qmax, dtype):
            continue
        limits = torch.iinfo(dtype)
        if not (limits.min <= qmin <= qmax <= limits.max and max(-qmin, qmax, abs(zero_point)) < FLOAT_EXACT):
            continue
        with graph.inserting_before(dequantize):
            value = graph.call_function(aten.mul.Tensor, (x, 1.0 / scale))
            value = graph.call_function(aten.round.default, (value,))
            value = graph.call_function(aten.add.Tensor, (value, float(zero_point)))
            value = graph.call_function(aten.clamp_min.default, (value, float(qmin)))
            value = graph.call_function(aten.clamp_max.default, (value, float(qmax)))
            value = graph.call_function(aten.sub.Tensor, (value, float(zero_point)))
            value = graph.call_function(aten.mul.Tensor, (value, scale))
        value.meta = dict(dequantize.meta)  # shape, dtype and strides, for the passes and lowering after
        dequantize.replace_all_uses_with(value)
        graph.erase_node(dequantize)
        replaced += 1
    graph.eliminate_dead_code()
    return replaced


def _padded_predictor(compiled: Any, input_shape: tuple[int, ...], settings: Settings) -> Predictor:
    """Feed the compiled model single images or fixed PREDICT_BATCH batches (zero-padded), the two shapes
    it was compiled for, always in fresh contiguous tensors, so it never recompiles (dynamo also guards on
    strides: numpy's ``image[None]`` has stride 0 on its batch axis, which cost a second compile)."""

    def predict(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=np.float32)
        outputs = []
        with settings(), torch.inference_mode():
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
