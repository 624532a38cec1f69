"""Bit widths in ONNX Runtime's QDQ format: 16-bit activations (ORT's int16/uint16 Q/DQ), weights narrower
than 8 bits (their scale and zero point computed for the narrow range and handed to ``quantize_static`` as
tensor overrides, so the int8/uint8 weights hold only that range), layers raised to 16 bits (mixed precision:
a ``quant_type`` tensor override each), and the width of every layer read back from a saved model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import QuantType

from resnet8ptq.dtype import DtypeConfig, bits_used
from resnet8ptq.errors import Unsupported
from resnet8ptq.layers import model_layers
from resnet8ptq.model import layer_name
from resnet8ptq.spec import LayerPrecision, QuantSpec
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


def check_widths(dtype: DtypeConfig) -> None:
    """Raise :class:`Unsupported` for widths ORT's QDQ format cannot hold exactly."""
    if dtype.activation_bits not in (8, 16):
        raise Unsupported(
            f"backend=onnx cannot run dtype.activation_bits={dtype.activation_bits}: ONNX Runtime's "
            f"QuantizeLinear saturates at its type's bounds (8 or 16 bits), so it runs 8 or 16 only "
            f"(backend=torch runs 4..8)."
        )


def tensor_overrides(model: onnx.ModelProto, spec: QuantSpec) -> dict[str, list[dict]]:
    """ORT ``TensorQuantOverrides`` for the spec: narrow weights (:func:`weight_overrides`) and raised layers
    (:func:`raised_overrides`). 16-bit Q/DQ need no contrib ops: ORT moves such a model to opset 21, where
    they are standard ops (with ``UseQDQContribOps`` ORT's qdq_loss_debug finds no activation to compare)."""
    return {**weight_overrides(model, spec), **raised_overrides(model, spec)}


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
    ``spec.dtype.weight_bits`` range (:func:`resnet8ptq.weight_grid.weight_grid`, ORT's own formula), per
    tensor or per channel. Empty for 8-bit weights: ORT computes the same parameters itself. Raised
    weights are left to :func:`raised_overrides`."""
    if spec.dtype.weight_bits == 8:
        return {}
    quant_type = QUANT_TYPES[spec.dtype.weight]
    overrides: dict[str, list[dict]] = {}
    for name, (node, weight) in quantized_weights(model).items():
        if layer_name(name) in spec.raised_layers:
            continue
        grid = weight_grid(weight, channel_axis(node), spec)
        params = [
            {"scale": scale, "zero_point": int(zero_point), "quant_type": quant_type}
            for scale, zero_point in zip(grid.scale, grid.zero_point, strict=True)
        ]
        if spec.per_channel:
            params[0]["axis"] = grid.axis
        overrides[name] = params
    return overrides


QUANTIZE_INPUT_SUFFIX = "_QuantizeLinear_Input"
"""ORT renames a graph output it quantizes to ``<name>_QuantizeLinear_Input`` (the Q/DQ pair then makes
``<name>``)."""


def layer_precision(model: onnx.ModelProto) -> list[LayerPrecision]:
    """Every quantized layer of a QDQ model as stored: activations by the type of their QuantizeLinear zero
    point (ORT quantizes to the type's bounds: its bits), conv/gemm weights by the type of the stored integers
    and the fewest bits holding them."""
    inits = {init.name: init for init in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            dtype = ONNX_DTYPE_NAMES[inits[node.input[2]].data_type]
            name = layer_name(node.input[0].removesuffix(QUANTIZE_INPUT_SUFFIX))
            layers.append(LayerPrecision(name, "activation", dtype, 8 * np.dtype(dtype).itemsize))
        elif node.op_type == "DequantizeLinear" and node.input[0].endswith("_quantized"):
            values = numpy_helper.to_array(inits[node.input[0]])
            if values.ndim >= 2:  # conv/gemm weights, not biases
                signed = np.issubdtype(values.dtype, np.signedinteger)
                bits = bits_used(min(int(values.min()), 0), max(int(values.max()), 0), signed)
                name = layer_name(node.input[0].removesuffix("_quantized"))
                layers.append(LayerPrecision(name, "weight", str(values.dtype), bits))
    return layers
