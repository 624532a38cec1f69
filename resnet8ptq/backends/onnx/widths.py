"""Bit widths in ONNX Runtime's QDQ format: 16-bit activations (ORT's int16/uint16 Q/DQ), weights narrower
than 8 bits (their scale and zero point computed for the narrow range and handed to ``quantize_static`` as
tensor overrides, so the int8/uint8 weights hold only that range), activations narrower than 8 bits (their
scale and zero point likewise, and an integer ``Clip`` to the narrow range after each activation
``QuantizeLinear``, which saturates at its type's bounds only), layers raised to 16 bits (mixed precision: a
``quant_type`` tensor override each), and the width of every layer read back from a saved model."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import QuantType

from resnet8ptq.dtype import bits_used, integer_range, ort_scale_zero_point
from resnet8ptq.layers import activation_width, expected_raised, model_layers, weight_widths
from resnet8ptq.model import layer_name
from resnet8ptq.spec import RAISED_BITS, LayerPrecision, QuantSpec
from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid

QUANT_TYPES = {
    "int8": QuantType.QInt8,
    "uint8": QuantType.QUInt8,
    "int16": QuantType.QInt16,
    "uint16": QuantType.QUInt16,
}
ONNX_DTYPE_NAMES = {
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.UINT16: "uint16",
}
NARROW_ACTIVATION_BITS = range(4, 8)
WEIGHTED_OPS = {"Conv", "Gemm", "MatMul"}
QUANTIZE_INPUT_SUFFIX = "_QuantizeLinear_Input"
"""ORT renames a graph output it quantizes to ``<name>_QuantizeLinear_Input`` (the Q/DQ pair then makes
``<name>``)."""
WIDE_SUFFIX = "_unclipped"
"""The name of an activation QuantizeLinear's own output, before :func:`clamp_narrow_activations`' Clip."""


def tensor_overrides(
    model: onnx.ModelProto, spec: QuantSpec, ranges: dict[str, tuple[float, float]], widths: dict[str, int]
) -> dict[str, list[dict]]:
    """ORT ``TensorQuantOverrides`` for the spec: narrow activations (:func:`activation_overrides`, from the
    calibrated ``ranges`` and their ``widths``, :func:`activation_widths`), narrow weights
    (:func:`weight_overrides`) and raised layers (:func:`raised_overrides`). 16-bit Q/DQ need no contrib
    ops: ORT moves such a model to opset 21, where they are standard ops (with ``UseQDQContribOps`` ORT's
    qdq_loss_debug finds no activation to compare)."""
    return {
        **activation_overrides(ranges, widths, spec),
        **weight_overrides(model, spec),
        **raised_overrides(model, spec),
    }


def activation_widths(model: onnx.ModelProto, spec: QuantSpec, tensors: Iterable[str]) -> dict[str, int]:
    """The width of each calibrated activation (``tensors``): the storage type's for the logits and what
    follows (:func:`narrowed_tensors`), else :func:`resnet8ptq.layers.activation_width` (raised, own
    ``layer_bits``, ``dtype.first_last_bits``, ``dtype.activation_bits``); 16 bits for a raised layer's."""
    tensors = list(tensors)
    raised = expected_raised(spec.raised_layers, model)
    narrowed = narrowed_tensors(model, tensors)
    storage_bits = 8 * np.dtype(spec.dtype.storage[0]).itemsize
    widths = {}
    for name in tensors:
        if name not in narrowed and layer_name(name) not in raised:
            widths[name] = storage_bits
        else:
            widths[name] = activation_width(layer_name(name), model, spec)
    return widths


def activation_overrides(
    ranges: dict[str, tuple[float, float]], widths: dict[str, int], spec: QuantSpec
) -> dict[str, list[dict]]:
    """For activations narrower than 8 bits (``widths``, :func:`activation_widths`): each calibrated
    tensor's scale and zero point for its narrow range :meth:`DtypeConfig.activation_range` (ORT's formula,
    as the torch backend's observers), so that ``quantize_static`` maps the calibrated range onto it;
    :func:`clamp_narrow_activations` then clamps to it. None at 8 and 16 bits: ORT computes the same
    parameters itself."""
    storage = np.dtype(spec.dtype.storage[0])
    overrides = {}
    for name, (low, high) in ranges.items():
        if widths[name] not in NARROW_ACTIVATION_BITS:
            continue
        qmin, qmax = spec.dtype.activation_range(widths[name])
        scale, zero_point = ort_scale_zero_point(low, high, qmin, qmax, symmetric=False)
        overrides[name] = [
            {"scale": np.array(scale, np.float32), "zero_point": np.array(zero_point, storage)}
        ]
    return overrides


def narrowed_tensors(model: onnx.ModelProto, tensors: Iterable[str]) -> set[str]:
    """The calibrated activations (``tensors``) that narrow activation widths apply to: every one up to the
    last conv/gemm layer's input. The logits and what follows (the softmax's probabilities) keep the storage
    type's 8 bits: the PyTorch backend does not quantize them at all, and probabilities in 2^b levels would
    tie the top classes."""
    last = max(i for i, node in enumerate(model.graph.node) if node.op_type in WEIGHTED_OPS)
    head = {name for node in model.graph.node[last:] for name in node.output}
    return set(tensors) - head


def activation_qranges(
    model: onnx.ModelProto, spec: QuantSpec, tensors: Iterable[str]
) -> dict[str, tuple[int, int]]:
    """The integer range each calibrated activation (``tensors``) will be stored in, by its width
    (:func:`activation_widths`): what ``calib=mse`` fits each range to."""
    qranges = {}
    for name, bits in activation_widths(model, spec, tensors).items():
        signedness = spec.raised_storage("activation") if bits == RAISED_BITS else spec.dtype.activation
        qranges[name] = integer_range(signedness, bits, symmetric=False)
    return qranges


def clamp_narrow_activations(model: onnx.ModelProto, spec: QuantSpec, widths: dict[str, int]) -> None:
    """Insert an integer ``Clip`` to :meth:`DtypeConfig.activation_range` of its width after the
    ``QuantizeLinear`` of each activation of ``model`` narrower than 8 bits (``widths``: the calibrated
    tensors', :func:`activation_widths`; in place): ``QuantizeLinear`` rounds and saturates at the
    int8/uint8 bounds, the Clip then at the narrow ones, which is quantization to the narrow type. The
    DequantizeLinear keeps its input's name (the Clip's output), so ORT's QDQ node units (DequantizeLinear
    -> op -> QuantizeLinear) and ``qdq_loss_debug``'s names are unchanged."""
    storage = np.dtype(spec.dtype.storage[0])
    inits = {init.name: init for init in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type != "QuantizeLinear" or node.input[0] in inits:
            continue
        quantized = node.input[0].removesuffix(QUANTIZE_INPUT_SUFFIX)
        raised = numpy_helper.to_array(inits[node.input[2]]).dtype != storage
        if widths.get(quantized) not in NARROW_ACTIVATION_BITS or raised:
            continue
        qmin, qmax = spec.dtype.activation_range(widths[quantized])
        clamped = node.output[0]
        node.output[0] = f"{clamped}{WIDE_SUFFIX}"
        bounds = [f"{clamped}_clip_min", f"{clamped}_clip_max"]
        for name, value in zip(bounds, (qmin, qmax), strict=True):
            model.graph.initializer.append(numpy_helper.from_array(np.array(value, storage), name))
        nodes.append(onnx.helper.make_node("Clip", [node.output[0], *bounds], [clamped], f"{clamped}_Clip"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def clip_weights(quantized: onnx.ModelProto, fp32: onnx.ModelProto, spec: QuantSpec) -> int:
    """Clip every stored conv/gemm weight of ``quantized`` (in place) to the integer range of its width: with
    the scale and zero point of :func:`weight_overrides` ORT rounds the weight and saturates only at the
    int8/uint8 bounds, so the weights that ``calib.weights=mse`` clips would keep values beyond the narrow
    range. Returns how many integers it clipped (none for min/max ranges)."""
    symmetric = spec.dtype.weight_symmetric(spec.per_channel)
    widths = weight_widths(fp32, spec)
    inits = {init.name: init for init in quantized.graph.initializer}
    clipped = 0
    for name in quantized_weights(fp32):
        stored = inits.get(f"{name}_quantized")
        if stored is None or layer_name(name) in spec.raised_layers:
            continue
        values = numpy_helper.to_array(stored)
        qmin, qmax = spec.dtype.weight_range(symmetric, spec.reduce_range, widths[name])
        inside = np.clip(values, qmin, qmax).astype(values.dtype)
        clipped += int(np.count_nonzero(inside != values))
        stored.CopyFrom(numpy_helper.from_array(inside, stored.name))
    return clipped


def raised_overrides(model: onnx.ModelProto, spec: QuantSpec) -> dict[str, list[dict]]:
    """A 16-bit ``quant_type`` for each raised layer's tensor (``spec.raised_layers``, storage types as
    :meth:`QuantSpec.raised_storage`): activations asymmetric (ORT's default), weights symmetric, per channel
    along the output channels when ``per_channel``."""
    layers = model_layers(model)
    weights = quantized_weights(model)
    overrides: dict[str, list[dict]] = {}
    for name in spec.raised_layers:
        layer = layers[name]
        params: dict[str, object] = {"quant_type": QUANT_TYPES[spec.raised_storage(layer.kind)]}
        if layer.kind == "weight":
            params |= {"symmetric": True, "reduce_range": False}
            if spec.per_channel:
                params["axis"] = channel_axis(weights[layer.tensor][0])
        overrides[layer.tensor] = [params]
    return overrides


def weight_overrides(model: onnx.ModelProto, spec: QuantSpec) -> dict[str, list[dict]]:
    """ORT ``TensorQuantOverrides`` giving every conv/gemm weight the scale and zero point of its
    width's range (:func:`resnet8ptq.layers.weight_widths`, :func:`resnet8ptq.weight_grid.weight_grid`,
    ORT's own formula), per tensor or per channel. None for 8-bit min/max weights: ORT computes the same
    parameters itself (``calib.weights=mse`` clips them, so they get theirs). Raised weights are left to
    :func:`raised_overrides`."""
    quant_type = QUANT_TYPES[spec.dtype.weight]
    widths = weight_widths(model, spec)
    overrides: dict[str, list[dict]] = {}
    for name, (node, weight) in quantized_weights(model).items():
        if layer_name(name) in spec.raised_layers or (widths[name] == 8 and spec.calib.weights == "minmax"):
            continue
        grid = weight_grid(weight, channel_axis(node), spec, widths[name])
        params = [
            {"scale": scale, "zero_point": int(zero_point), "quant_type": quant_type}
            for scale, zero_point in zip(grid.scale, grid.zero_point, strict=True)
        ]
        if spec.per_channel:
            params[0]["axis"] = grid.axis
        overrides[name] = params
    return overrides


def layer_precision(model: onnx.ModelProto) -> list[LayerPrecision]:
    """Every quantized layer of a QDQ model as stored: activations by the type of their QuantizeLinear zero
    point and the bounds they are clamped to (the type's, or an integer Clip's right after), conv/gemm weights
    by the type of the stored integers and the fewest bits holding them."""
    inits = {init.name: init for init in model.graph.initializer}
    clips = {node.input[0]: node for node in model.graph.node if node.op_type == "Clip"}
    layers = []
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            dtype = ONNX_DTYPE_NAMES[inits[node.input[2]].data_type]
            name = layer_name(node.input[0].removesuffix(QUANTIZE_INPUT_SUFFIX))
            bits = 8 * np.dtype(dtype).itemsize
            if node.output[0] in clips:
                low, high = (int(numpy_helper.to_array(inits[b])) for b in clips[node.output[0]].input[1:3])
                bits = bits_used(low, high, np.issubdtype(np.dtype(dtype), np.signedinteger))
            layers.append(LayerPrecision(name, "activation", dtype, bits))
        elif node.op_type == "DequantizeLinear" and node.input[0].endswith("_quantized"):
            values = numpy_helper.to_array(inits[node.input[0]])
            if values.ndim >= 2:  # conv/gemm weights, not biases
                signed = np.issubdtype(values.dtype, np.signedinteger)
                bits = bits_used(min(int(values.min()), 0), max(int(values.max()), 0), signed)
                name = layer_name(node.input[0].removesuffix("_quantized"))
                layers.append(LayerPrecision(name, "weight", str(values.dtype), bits))
    return layers
