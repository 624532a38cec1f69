"""From a quantize/dequantize (QDQ) graph to the integer description: the lowering ONNX Runtime's QDQ models
and PyTorch's PT2E programs share.

A QDQ model computes each layer in float on dequantized integers and quantizes the result (round half to
even, clamp). Integer hardware computes the same layer as an integer accumulator and a fixed-point
requantization; the readers (``backends/onnx/integer.py``, ``backends/torch/integer.py``) describe each
layer as a :class:`QdqLayer` and :func:`lower` turns it into TFLite/gemmlowp's scheme:

* conv/dense: acc = Σ (x - x_zp)(w - w_zp) + bias, multiplier/shift for x_scale · w_scale / y_scale. A bias
  stored in float (PyTorch's) is rounded to int32 at the scale x_scale · w_scale, as TFLite's converter does;
* add: TFLite's integer add (both inputs rescaled to twice the larger scale, 20 bits of headroom);
* a global average pool with the input's quantization: TFLite's rounded integer division; with another
  output quantization, the sum requantized.

Where the results can differ from the QDQ model's float arithmetic (so the integer executor's predictions
differ on a few images): the float conv's own rounding, float vs fixed-point requantization at half-way
values (half to even vs half away from zero), the bias rounding, and the average pool's rounding at ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resnet8ptq.device.fixed_point import quantize_multiplier
from resnet8ptq.device.graph import (
    RESIDUAL_FRACTION_BITS,
    Add,
    AveragePool,
    Conv,
    IntegerModel,
    Layer,
    MaxPool,
    Quant,
    Residual,
    conv_requantization,
    integer_add,
)

INT8_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def quant(scale: float, zero_point: int, dtype: str, bounds: tuple[int, int] | None = None) -> Quant:
    """An activation quantization stored in 8 bits, clamped to the type's range or to ``bounds`` (a narrower
    width). 16-bit activations are not covered by the integer executor yet."""
    if dtype not in INT8_RANGES:
        raise ValueError(
            f"activations of type {dtype}: the integer executor covers 8-bit activations (int8, uint8)."
        )
    return Quant(float(np.float32(scale)), int(zero_point), *(bounds or INT8_RANGES[dtype]))


@dataclass
class QdqLayer:
    """One layer of a QDQ model: its kind, the quantized tensors it reads and writes, and for conv/dense its
    integer weights (O, I, kh, kw), their scales and zero points (per channel), and its bias (int32 at
    x_scale · w_scale, or float)."""

    kind: str  # "conv" | "dense" | "add" | "average_pool" | "max_pool"
    name: str
    inputs: list[str]
    output: str
    weight: np.ndarray | None = None
    weight_scale: np.ndarray | None = None
    weight_zero_point: np.ndarray | None = None
    bias: np.ndarray | None = None
    bias_is_float: bool = False
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    relu: bool = False  # an explicit ReLU between the op and its quantization
    relu_max: float | None = None  # conv only: a ReLU6's upper bound (ONNX Clip(0, 6), torch hardtanh/clamp)
    residual: str | None = None  # conv only: a quantized tensor added to its output before quantization
    groups: int = 1  # conv only: input-channel groups (C_in: depthwise)
    kernel: tuple[int, int] = (1, 1)  # max_pool only: the window


def is_layout_reshape(before: tuple, after: tuple) -> bool:
    """Whether reshaping an (N, H, W, 1) input to ``after`` is NHWC -> NCHW, the transpose the integer
    device's input takes (one channel: a converted .tflite's reshape, as MLPerf Tiny's KWS model's)."""
    before, after = tuple(before), tuple(after)
    return len(before) == 4 and before[3] == 1 and after[1:] == (1, before[1], before[2])


def bias_fitting_scales(
    layer: QdqLayer, q_in: Quant, weight_scale: np.ndarray, zero_point: np.ndarray
) -> np.ndarray:
    """The weight scales with each channel whose weights are all zero (a pruned or dead channel: MLPerf Tiny's
    VWW model has some) given the least scale at which its float bias fits the int32 accumulator, as ONNX
    Runtime's quantizer does ("Increased scale for weight ... to ensure bias input has a valid scale"): its
    weights stay zero at any scale, and at the observer's tiny scale its bias would overflow."""
    weight = np.asarray(layer.weight).reshape(len(weight_scale), -1)
    dead = np.all(weight == zero_point[:, None], axis=1)
    needed = np.abs(np.asarray(layer.bias, np.float64)) / (np.float64(q_in.scale) * (2**31 - 1))
    return np.where(dead & (weight_scale < needed), needed * 2, weight_scale).astype(np.float32)


def lower_conv(layer: QdqLayer, q_in: Quant, q_out: Quant | None, quants: dict[str, Quant]) -> Conv:
    channels = len(layer.weight)
    weight_scale = np.broadcast_to(np.asarray(layer.weight_scale, np.float32), (channels,)).copy()
    zero_point = np.broadcast_to(np.asarray(layer.weight_zero_point, np.int32), (channels,)).copy()
    if layer.bias is None:
        bias = np.zeros(channels, np.int32)
    elif layer.bias_is_float:
        weight_scale = bias_fitting_scales(layer, q_in, weight_scale, zero_point)
        bias_scale = np.float64(q_in.scale) * weight_scale.astype(np.float64)
        bias = np.round(np.asarray(layer.bias, np.float64) / bias_scale).astype(np.int32)
    else:
        bias = np.asarray(layer.bias).astype(np.int32)
    if q_out is None:  # the logits left in float: the accumulator is the output
        multiplier, shift = np.zeros(channels, np.int64), np.zeros(channels, np.int64)
        act_min, act_max = -(2**31), 2**31 - 1
    else:
        multiplier, shift = conv_requantization(q_in.scale, weight_scale, q_out.scale)
        act_min, act_max = q_out.clamp_min(layer.relu), q_out.qmax
        if layer.relu_max is not None:  # the quantized bound, rounded half to even as the quantizer does
            bound = q_out.zero_point + int(np.round(np.float32(layer.relu_max) / np.float32(q_out.scale)))
            act_max = min(act_max, bound)
    residual = None
    if layer.residual is not None:
        q_res = quants[layer.residual]
        fraction = 2.0**RESIDUAL_FRACTION_BITS
        multiplier, shift = conv_requantization(q_in.scale, weight_scale * np.float32(fraction), q_out.scale)
        (res_multiplier,), (res_shift,) = quantize_multiplier(
            np.float64(q_res.scale) * fraction / np.float64(q_out.scale)
        )
        residual = Residual(layer.residual, q_res, int(res_multiplier), int(res_shift))
    return Conv(
        name=layer.name,
        input=layer.inputs[0],
        output=layer.output,
        weight=np.asarray(layer.weight, np.int32),
        weight_zero_point=zero_point,
        weight_scale=weight_scale,
        bias=bias,
        stride=layer.stride,
        padding=layer.padding,
        input_quant=q_in,
        output_quant=q_out,
        multiplier=multiplier,
        shift=shift,
        act_min=act_min,
        act_max=act_max,
        dense=layer.kind == "dense",
        rounding="single",
        residual=residual,
        groups=layer.groups,
    )


def lower_add(layer: QdqLayer, quants: tuple[Quant, Quant], q_out: Quant) -> Add:
    inputs = (layer.inputs[0], layer.inputs[1])
    return integer_add(layer.name, inputs, layer.output, quants, q_out, layer.relu, "single")


def lower_pool(layer: QdqLayer, q_in: Quant, q_out: Quant, window: int) -> AveragePool:
    if (q_in.scale, q_in.zero_point) == (q_out.scale, q_out.zero_point):
        return AveragePool(
            layer.name, layer.inputs[0], layer.output, q_in, q_out, rounding_divide=True, half_to_even=True
        )
    (multiplier,), (shift,) = quantize_multiplier(np.float64(q_in.scale) / (window * np.float64(q_out.scale)))
    return AveragePool(
        layer.name, layer.inputs[0], layer.output, q_in, q_out, False, int(multiplier), int(shift)
    )


def lower_max_pool(layer: QdqLayer, q_in: Quant, q_out: Quant) -> MaxPool:
    if (q_in.scale, q_in.zero_point) != (q_out.scale, q_out.zero_point) or layer.relu:
        raise ValueError(
            f"{layer.name}: a max pool whose output is quantized otherwise than its input (or with a ReLU "
            "after it) is not covered."
        )
    return MaxPool(
        layer.name, layer.inputs[0], layer.output, q_out, layer.kernel, layer.stride, layer.padding
    )


def execution_order(layers: list[QdqLayer], input_name: str) -> list[QdqLayer]:
    """``layers`` reordered so that each comes after the layers making its inputs and residual (a fused
    conv + add reads a tensor that a later node of the graph may compute)."""
    ready, ordered, pending = {input_name}, [], list(layers)
    while pending:
        layer = next(
            (
                candidate
                for candidate in pending
                if all(name in ready for name in [*candidate.inputs, candidate.residual or input_name])
            ),
            None,
        )
        if layer is None:
            raise ValueError(f"Layers {[p.name for p in pending]} read tensors no layer computes.")
        pending.remove(layer)
        ordered.append(layer)
        ready.add(layer.output)
    return ordered


def lower(
    source: str,
    layers: list[QdqLayer],
    quants: dict[str, Quant],
    input_name: str,
    pool_windows: dict[str, int],
    notes: list[str],
) -> IntegerModel:
    """The integer description of a QDQ model: ``quants`` maps every quantized tensor to its quantization,
    ``pool_windows`` each average pool to its window size."""
    lowered: list[Layer] = []
    for layer in execution_order(layers, input_name):
        q_out = quants.get(layer.output)
        if q_out is None and (layer is not layers[-1] or layer.kind != "dense" or layer.relu):
            raise ValueError(f"{layer.name}: only the last dense layer may leave its output unquantized.")
        if layer.relu_max is not None and layer.kind not in ("conv", "dense"):
            raise ValueError(f"{layer.name}: a clamp (ReLU6) after a {layer.kind} layer is not covered.")
        if layer.kind in ("conv", "dense"):
            lowered.append(lower_conv(layer, quants[layer.inputs[0]], q_out, quants))
        elif layer.kind == "add":
            lowered.append(lower_add(layer, (quants[layer.inputs[0]], quants[layer.inputs[1]]), q_out))
        elif layer.kind == "average_pool":
            lowered.append(lower_pool(layer, quants[layer.inputs[0]], q_out, pool_windows[layer.name]))
        elif layer.kind == "max_pool":
            lowered.append(lower_max_pool(layer, quants[layer.inputs[0]], q_out))
        else:
            raise ValueError(f"{layer.name}: layer kind {layer.kind!r} is not covered.")
    return IntegerModel(
        source=source,
        input=input_name,
        input_quant=quants[input_name],
        input_rounding="half_to_even",
        layers=lowered,
        notes=notes,
    )
