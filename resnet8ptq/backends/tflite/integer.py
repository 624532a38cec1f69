"""A fully-integer .tflite model as the device's integer description (:mod:`resnet8ptq.device.graph`).

TFLite stores the integers already: int8 weights (per-channel scales, zero point 0), int32 biases, int8
activations with scale and zero point. What this adds is what TFLite's kernels derive at ``Prepare``: the
requantization multipliers and shifts (``PopulateConvolutionQuantizationParams`` for CONV_2D and
DEPTHWISE_CONV_2D, ``GetQuantizedConvolutionMultipler`` for FULLY_CONNECTED, ``PrepareGeneralSubOp`` for ADD),
the SAME padding (``ComputePaddingHeightWidth``) and the fused ReLU's or ReLU6's clamp
(``CalculateActivationRangeQuantized``). Checked bit for bit against LiteRT's reference kernels on ResNet8
(tests/integration/test_device.py) and on MLPerf Tiny's int8 VWW, KWS and AD models
(tests/integration/test_device_mlperf.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from resnet8ptq.backends.tflite.flatbuffer import Tensor, TFLiteModel, read, tflite_layer_name
from resnet8ptq.device.fixed_point import quantize_multiplier
from resnet8ptq.device.graph import (
    Add,
    AveragePool,
    Conv,
    IntegerModel,
    Layer,
    MaxPool,
    Quant,
    conv_requantization,
    integer_add,
)

FUSED = {
    schema.ActivationFunctionType.NONE: (None, None),
    schema.ActivationFunctionType.RELU: (0.0, None),
    schema.ActivationFunctionType.RELU6: (0.0, 6.0),
    schema.ActivationFunctionType.RELU_N1_TO_1: (-1.0, 1.0),
}
"""A fused activation's real clamp (low, high; None: the type's limit)."""
PASS_THROUGH = {"RESHAPE", "SQUEEZE"}  # the flatten before the dense layer: no arithmetic
AFTER_LOGITS = {"SOFTMAX", "DEQUANTIZE"}  # the host's part: the logits' argmax is the prediction


class NotInteger(ValueError):
    """The .tflite model holds an op or type the integer description does not cover."""


def quant(tensor: Tensor) -> Quant:
    """A quantized activation tensor's scale, zero point and integer range."""
    if tensor.dtype not in ("int8", "uint8") or len(tensor.scales) != 1:
        raise NotInteger(
            f"tensor {tensor.name!r} is {tensor.dtype} with {len(tensor.scales)} scales: the integer form "
            f"covers 8-bit activations quantized per tensor (16x8 models are not covered yet)."
        )
    info = np.iinfo(tensor.dtype)
    return Quant(float(tensor.scales[0]), int(tensor.zero_points[0]), int(info.min), int(info.max))


def activation_range(options: object, op: str, q: Quant) -> tuple[int, int]:
    """The output's integer clamp for the op's fused activation, as TFLite's
    ``CalculateActivationRangeQuantized``: each real bound as zero_point + round(bound / scale) (float32
    division, half away from zero), within the type's range."""
    activation = getattr(options, "fusedActivationFunction", schema.ActivationFunctionType.NONE)
    if activation not in FUSED:
        names = {code: name for name, code in vars(schema.ActivationFunctionType).items() if name.isupper()}
        raise NotInteger(
            f"{op} with fused activation {names.get(activation, activation)}: the integer executor covers "
            f"{', '.join(names[code] for code in FUSED)}."
        )

    def level(bound: float) -> int:
        scaled = np.float32(bound) / np.float32(q.scale)
        return q.zero_point + int(np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5)))

    low, high = FUSED[activation]
    return (
        q.qmin if low is None else max(q.qmin, level(low)),
        q.qmax if high is None else min(q.qmax, level(high)),
    )


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TFLite's SAME padding (before, after): the odd pixel goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def conv(model: TFLiteModel, op: str, inputs: list[int], output: int, options: object) -> Conv:
    """CONV_2D (weight OHWI), DEPTHWISE_CONV_2D (weight 1HW(C·M), one group per input channel) or
    FULLY_CONNECTED (weight OI) with its requantization."""
    x, w, b = (model.tensors[i] for i in inputs[:3])
    y = model.tensors[output]
    q_in, q_out = quant(x), quant(y)
    dense = op == "FULLY_CONNECTED"
    weight = w.values.astype(np.int32)
    groups = x.shape[3] if op == "DEPTHWISE_CONV_2D" else 1
    if dense:
        weight = weight[:, :, None, None]
    else:  # OHWI, and depthwise's 1HW(C·M) as (C·M)1HW: output c·M + m reads input channel c
        weight = weight.transpose(3, 0, 1, 2) if groups > 1 else weight.transpose(0, 3, 1, 2)
    channels = len(weight)
    weight_scale = np.broadcast_to(w.scales.astype(np.float32), (channels,)).copy()
    multiplier, shift = conv_requantization(q_in.scale, weight_scale, q_out.scale)
    if dense:
        stride, padding = (1, 1), (0, 0, 0, 0)
    else:
        stride = (options.strideH, options.strideW)
        if (options.dilationHFactor, options.dilationWFactor) != (1, 1):
            raise NotInteger(f"{y.name}: dilated convolutions are not covered.")
        padding = (0, 0, 0, 0)
        if options.padding == schema.Padding.SAME:
            padding = (
                *same_padding(x.shape[1], weight.shape[2], stride[0]),
                *same_padding(x.shape[2], weight.shape[3], stride[1]),
            )
    bias = (
        b.values.astype(np.int32) if b is not None and b.values is not None else np.zeros(channels, np.int32)
    )
    clamp = activation_range(options, op, q_out)
    return Conv(
        name=tflite_layer_name(model, output),
        input=str(inputs[0]),
        output=str(output),
        weight=weight,
        weight_zero_point=np.broadcast_to(w.zero_points.astype(np.int32), (channels,)).copy(),
        weight_scale=weight_scale,
        bias=bias,
        stride=stride,
        padding=padding,
        input_quant=q_in,
        output_quant=q_out,
        multiplier=multiplier,
        shift=shift,
        act_min=clamp[0],
        act_max=clamp[1],
        dense=dense,
        rounding="single" if dense else "double",  # as LiteRT's reference kernels round (checked in tests)
        groups=groups,
    )


def add(model: TFLiteModel, inputs: list[int], output: int, options: object) -> Add:
    quants = (quant(model.tensors[inputs[0]]), quant(model.tensors[inputs[1]]))
    q_out = quant(model.tensors[output])
    low, high = activation_range(options, "ADD", q_out)
    if high != q_out.qmax:
        raise NotInteger(f"{model.tensors[output].name}: ADD with a fused ReLU6 is not covered.")
    relu = low != q_out.qmin
    return integer_add(
        tflite_layer_name(model, output),
        (str(inputs[0]), str(inputs[1])),
        str(output),
        quants,
        quant(model.tensors[output]),
        relu,
        "double",
    )


def average_pool(model: TFLiteModel, inputs: list[int], output: int, options: object) -> AveragePool:
    x, y = model.tensors[inputs[0]], model.tensors[output]
    q = quant(y)
    if (options.filterHeight, options.filterWidth) != tuple(x.shape[1:3]) or activation_range(
        options, "AVERAGE_POOL_2D", q
    ) != (q.qmin, q.qmax):
        raise NotInteger(f"{y.name}: only a global average pool (the window is the whole input) is covered.")
    q_in, q_out = quant(x), quant(y)
    if (q_in.scale, q_in.zero_point) != (q_out.scale, q_out.zero_point):
        raise NotInteger(
            f"{y.name}: TFLite's int8 AVERAGE_POOL_2D needs equal input and output quantization."
        )
    return AveragePool(tflite_layer_name(model, output), str(inputs[0]), str(output), q_in, q_out, True)


def mean(model: TFLiteModel, inputs: list[int], output: int, options: object) -> AveragePool:
    """MEAN over H and W of an NHWC tensor, its dims dropped (Keras' GlobalAveragePooling2D), as LiteRT's
    reference ``QuantizedMeanOrSum`` computes it: the sum of (q - input zero point) requantized by
    input_scale / output_scale with 1/count folded into the multiplier (multiplier << s // count, shift - s,
    s = floor(log2 count), at most 32 and 31 + shift)."""
    x, y = model.tensors[inputs[0]], model.tensors[output]
    axes = model.tensors[inputs[1]].values
    q_in, q_out = quant(x), quant(y)
    if len(x.shape) != 4 or axes is None or sorted(int(a) % 4 for a in axes.reshape(-1)) != [1, 2]:
        raise NotInteger(f"{y.name}: MEAN over axes {axes} of {tuple(x.shape)}: H and W only are covered.")
    same = (q_in.scale, q_in.zero_point) == (q_out.scale, q_out.zero_point)
    if getattr(options, "keepDims", False) or same:
        raise NotInteger(
            f"{y.name}: MEAN with keep_dims, or with its input's quantization, is not covered (checked "
            "against LiteRT: Keras' GlobalAveragePooling2D's MEAN, which drops the dims and requantizes)."
        )
    count = int(x.shape[1] * x.shape[2])
    real = np.float64(np.float32(q_in.scale)) / np.float64(np.float32(q_out.scale))  # PrepareMeanOrSum's
    (multiplier,), (shift,) = quantize_multiplier(real)
    fold = min(count.bit_length() - 1, 32, 31 + int(shift))
    multiplier, shift = (int(multiplier) << fold) // count, int(shift) - fold
    name = tflite_layer_name(model, output)
    return AveragePool(name, str(inputs[0]), str(output), q_in, q_out, False, multiplier, shift)


def max_pool(model: TFLiteModel, inputs: list[int], output: int, options: object) -> MaxPool:
    """MAX_POOL_2D: TFLite's int8 kernel needs equal input and output quantization; SAME padding's
    positions are left out of the window (``ComputePaddingHeightWidth``'s padding, never the maximum)."""
    x, y = model.tensors[inputs[0]], model.tensors[output]
    q_in, q_out = quant(x), quant(y)
    if (q_in.scale, q_in.zero_point) != (q_out.scale, q_out.zero_point):
        raise NotInteger(f"{y.name}: TFLite's int8 MAX_POOL_2D needs equal input and output quantization.")
    kernel, stride = (options.filterHeight, options.filterWidth), (options.strideH, options.strideW)
    padding = (0, 0, 0, 0)
    if options.padding == schema.Padding.SAME:
        padding = (
            *same_padding(x.shape[1], kernel[0], stride[0]),
            *same_padding(x.shape[2], kernel[1], stride[1]),
        )
    low, high = activation_range(options, "MAX_POOL_2D", q_out)
    name = tflite_layer_name(model, output)
    return MaxPool(name, str(inputs[0]), str(output), q_out, kernel, stride, padding, low, high)


def integer_model(path: Path) -> IntegerModel:
    """The integer description of the fully-integer .tflite file at ``path`` (int8 activations)."""
    model = read(path)
    input_index = model.inputs[0]
    layers: list[Layer] = []
    alias: dict[int, int] = {}  # tensors that are another tensor (the flatten's output)
    for (op, inputs, outputs), options in zip(model.ops, model.options, strict=True):
        inputs = [alias.get(i, i) for i in inputs]
        if op == "QUANTIZE" and inputs[0] == input_index:
            input_index = outputs[0]  # the float input's quantization: done by quantize_input
        elif op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            layers.append(conv(model, op, inputs, outputs[0], options))
        elif op == "ADD":
            layers.append(add(model, inputs, outputs[0], options))
        elif op == "AVERAGE_POOL_2D":
            layers.append(average_pool(model, inputs, outputs[0], options))
        elif op == "MAX_POOL_2D":
            layers.append(max_pool(model, inputs, outputs[0], options))
        elif op == "MEAN":
            layers.append(mean(model, inputs, outputs[0], options))
        elif op in PASS_THROUGH:
            alias[outputs[0]] = inputs[0]
        elif op in AFTER_LOGITS or all(model.tensors[i].dtype == "int32" for i in outputs):
            continue  # the host's softmax, or shape arithmetic (SHAPE, STRIDED_SLICE, PACK of a flatten)
        else:
            raise NotInteger(f"{Path(path).name}: op {op} is not covered by the integer executor.")
    return IntegerModel(
        source="tflite",
        input=str(input_index),
        input_quant=quant(model.tensors[input_index]),
        input_rounding="half_away_from_zero",
        layers=layers,
    )
