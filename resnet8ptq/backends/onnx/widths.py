"""Bit widths in ONNX Runtime's QDQ format: 16-bit activations (ORT's int16/uint16 Q/DQ), weights narrower
than 8 bits (their scale and zero point computed for the narrow range and handed to ``quantize_static`` as
tensor overrides, so the int8/uint8 weights hold only that range), and the widths read back from a model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import QuantType

from resnet8ptq.backends.base import QuantSpec, Unsupported
from resnet8ptq.dtype import DtypeConfig, bits_used
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


def extra_options(dtype: DtypeConfig) -> dict[str, object]:
    """``quantize_static`` extra options for the widths: int16 Q/DQ are com.microsoft ops before opset 21."""
    return {"UseQDQContribOps": True} if dtype.activation_bits == 16 else {}


def weight_overrides(model: onnx.ModelProto, spec: QuantSpec) -> dict[str, list[dict]]:
    """ORT ``TensorQuantOverrides`` giving every conv/gemm weight the scale and zero point of its
    ``spec.dtype.weight_bits`` range (:func:`resnet8ptq.weight_grid.weight_grid`, ORT's own formula), per
    tensor or per channel. Empty for 8-bit weights: ORT computes the same parameters itself."""
    if spec.dtype.weight_bits == 8:
        return {}
    quant_type = QUANT_TYPES[spec.dtype.weight]
    overrides: dict[str, list[dict]] = {}
    for name, (node, weight) in quantized_weights(model).items():
        grid = weight_grid(weight, channel_axis(node), spec)
        params = [
            {"scale": scale, "zero_point": int(zero_point), "quant_type": quant_type}
            for scale, zero_point in zip(grid.scale, grid.zero_point, strict=True)
        ]
        if spec.per_channel:
            params[0]["axis"] = grid.axis
        overrides[name] = params
    return overrides


def effective_bits(model: onnx.ModelProto) -> tuple[int, int]:
    """(activation bits, weight bits) of a QDQ model: activations, the bits of their storage type (ORT
    quantizes to its bounds); weights, the fewest bits that hold every stored weight integer."""
    inits = {init.name: init for init in model.graph.initializer}
    activation, low, high, signed = set(), 0, 0, True
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            activation.add(8 * np.dtype(numpy_helper.to_array(inits[node.input[2]]).dtype).itemsize)
        elif node.op_type == "DequantizeLinear" and node.input[0].endswith("_quantized"):
            values = numpy_helper.to_array(inits[node.input[0]])
            if values.ndim >= 2:  # conv/gemm weights, not biases
                signed = np.issubdtype(values.dtype, np.signedinteger)
                low, high = min(low, int(values.min())), max(high, int(values.max()))
    if len(activation) != 1:
        raise RuntimeError(
            f"Expected one activation width in the quantized model, found {sorted(activation)}."
        )
    return activation.pop(), bits_used(low, high, signed)
