"""An ONNX Runtime QDQ model (``quantize_static``, QDQ format) as the device's integer description.

The QDQ graph is read node by node: ``DequantizeLinear`` on an initializer is a weight or an int32 bias (per
channel along its axis), on an activation the quantized tensor a layer reads; the ``QuantizeLinear`` after a
Conv/Gemm/Add/AveragePool/GlobalAveragePool (through a Relu, if ORT kept one) the quantized tensor it writes,
clamped to a narrower width by the integer ``Clip`` right after it where activations are narrower than 8 bits.
A Transpose of the NHWC input and a Reshape before the dense layer carry no arithmetic. The lowering to
integer arithmetic is shared with PyTorch's programs (:mod:`resnet8ptq.device.qdq`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.device.qdq import QdqLayer, is_layout_reshape, lower, quant
from resnet8ptq.model import layer_name

LAYER_OPS = {
    "Conv": "conv",
    "Gemm": "dense",
    "Add": "add",
    "AveragePool": "average_pool",
    "GlobalAveragePool": "average_pool",
    "MaxPool": "max_pool",
}
PASS_THROUGH = {"Transpose", "Reshape", "Flatten", "Relu"}
AFTER_LOGITS = {"Softmax"}
TYPE_NAMES = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}


def integer_model(path: Path) -> IntegerModel:
    """The integer description of the QDQ model at ``path``."""
    graph = onnx.shape_inference.infer_shapes(onnx.load(path)).graph  # a global pool's window: its input's
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    input_shape = tuple(d.dim_value for d in graph.input[0].type.tensor_type.shape.dim)  # 0: free
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    dequantized: dict[str, tuple] = {}  # DQ output -> (quantized tensor or constant values, scale, zp, axis)
    quants, quantized_of = {}, {}  # quantized tensor -> Quant; float tensor -> the quantized tensor
    quantizes = {}  # quantized tensor -> the float tensor it quantizes
    for node in graph.node:
        if node.op_type == "DequantizeLinear":
            source, scale, zero_point = [*node.input, ""][:3]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            values = constants.get(source)
            zp = constants[zero_point] if zero_point else np.zeros_like(constants[scale], np.int32)
            dequantized[node.output[0]] = (source if values is None else values, constants[scale], zp, axis)
        elif node.op_type == "QuantizeLinear":
            scale, zero_point = constants[node.input[1]], constants[node.input[2]]
            dtype = TYPE_NAMES.get(onnx.helper.np_dtype_to_tensor_dtype(zero_point.dtype))
            if dtype is None:
                raise ValueError(f"{Path(path).name}: activations of type {zero_point.dtype}: 8-bit only.")
            output, bounds = node.output[0], None
            clip = next((c for c in consumers.get(output, []) if c.op_type == "Clip"), None)
            if clip is not None:  # a narrow width (backends/onnx/widths.py: clamp_narrow_activations)
                low, high = (int(constants[name]) for name in clip.input[1:3])
                output, bounds = clip.output[0], (low, high)
            quants[output] = quant(float(scale), int(zero_point), dtype, bounds)
            quantized_of[node.input[0]] = output
            quantizes[output] = node.input[0]
    producers = {name: node for node in graph.node for name in node.output}

    def quantized_input(name: str) -> str:
        """The quantized tensor a layer input dequantizes, through pass-through ops (a Reshape between a
        DequantizeLinear and a QuantizeLinear of the same values is the same tensor)."""
        while True:
            while name not in dequantized:
                producer = producers[name]
                if producer.op_type not in PASS_THROUGH:
                    raise ValueError(f"{name} is not a dequantized tensor.")
                name = producer.input[0]
            tensor = dequantized[name][0]
            producer = producers.get(quantizes.get(tensor, ""))
            if producer is None or producer.op_type not in {"Reshape", "Flatten"}:
                return tensor
            if producer.input[0] not in producers:  # the graph input: only an NHWC -> NCHW reshape
                if not is_layout_reshape(input_shape, constants.get(producer.input[1], ())):
                    raise ValueError(f"{producer.name}: a reshape of the model input is not covered.")
                return tensor
            name = producer.input[0]

    def quantized_output(name: str) -> tuple[str, bool, float | None]:
        """The quantized tensor a layer's float output becomes, whether a ReLU lies between, and a ReLU6's
        upper bound (a Clip from 0)."""
        relu, high = False, None
        while name not in quantized_of:
            (node,) = consumers[name]
            if node.op_type == "Clip":
                bounds = [*node.input, "", ""][1:3]
                low, high = (float(constants[bound]) if bound else None for bound in bounds)
                if low != 0.0 or high is None:
                    raise ValueError(f"{node.name}: Clip({low}, {high}) is not covered (ReLU6: from 0).")
            elif node.op_type != "Relu":
                raise ValueError(f"{name} is not quantized after its layer.")
            relu, name = True, node.output[0]
        return quantized_of[name], relu, high

    layers, windows = [], {}
    for node in graph.node:
        if node.op_type in AFTER_LOGITS:
            break
        if node.op_type not in LAYER_OPS:
            if node.op_type not in PASS_THROUGH | {"QuantizeLinear", "DequantizeLinear", "Clip"}:
                raise ValueError(
                    f"{Path(path).name}: op {node.op_type} is not covered by the integer executor."
                )
            continue
        output, relu, high = quantized_output(node.output[0])
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        layer = QdqLayer(LAYER_OPS[node.op_type], layer_name(node.output[0]), [], output, relu=relu)
        layer.relu_max = high
        if node.op_type in ("Conv", "Gemm"):
            layer.inputs = [quantized_input(node.input[0])]
            weight, w_scale, w_zp, axis = dequantized[node.input[1]]
            if node.op_type == "Gemm":
                if attributes.get("transA", 0) or attributes.get("alpha", 1.0) != 1.0:
                    raise ValueError(f"{layer.name}: Gemm with transA or alpha is not covered.")
                weight = weight if attributes.get("transB", 0) else weight.T  # (O, I)
                weight = weight[:, :, None, None]
            else:
                pads = attributes.get("pads", [0, 0, 0, 0])  # top, left, bottom, right
                layer.padding = (pads[0], pads[2], pads[1], pads[3])
                layer.stride = tuple(attributes.get("strides", [1, 1]))
                if set(attributes.get("dilations", [1, 1])) != {1}:
                    raise ValueError(f"{layer.name}: dilated convolutions are not covered.")
                layer.groups = attributes.get("group", 1)
            layer.weight, layer.weight_scale, layer.weight_zero_point = weight, w_scale, w_zp
            if len(node.input) > 2:
                bias = node.input[2]
                if bias in dequantized:
                    layer.bias = dequantized[bias][0]
                else:
                    layer.bias, layer.bias_is_float = constants[bias], True
        elif node.op_type == "Add":
            layer.inputs = [quantized_input(name) for name in node.input]
        elif node.op_type == "MaxPool":
            if attributes.get("ceil_mode", 0) or set(attributes.get("dilations", [1, 1])) != {1}:
                raise ValueError(f"{layer.name}: MaxPool with ceil_mode or dilations is not covered.")
            layer.inputs = [quantized_input(node.input[0])]
            layer.kernel = tuple(attributes["kernel_shape"])
            layer.stride = tuple(attributes.get("strides", [1, 1]))
            pads = attributes.get("pads", [0, 0, 0, 0])  # top, left, bottom, right
            layer.padding = (pads[0], pads[2], pads[1], pads[3])
        else:  # AveragePool over the whole input, or GlobalAveragePool
            layer.inputs = [quantized_input(node.input[0])]
            window = attributes.get("kernel_shape") or spatial_shape(graph, node.input[0])
            windows[layer.name] = int(np.prod(window))
        layers.append(layer)

    first = next(n for n in graph.node if n.op_type == "QuantizeLinear")
    notes = [
        "ONNX Runtime's QDQ model computes each layer in float and quantizes it rounding half to even; the "
        "integer form accumulates exactly and requantizes in fixed point, each layer's rounding 'single' "
        "(TFLITE_SINGLE_ROUNDING: x * multiplier * 2^(shift - 31) rounded once, half up)."
    ]
    return lower("onnx-qdq", layers, quants, quantized_of[first.input[0]], windows, notes)


def spatial_shape(graph: onnx.GraphProto, name: str) -> list[int]:
    """The (H, W) of the NCHW tensor ``name``, from the graph's shape inference."""
    info = next((v for v in graph.value_info if v.name == name), None)
    dims = [d.dim_value for d in info.type.tensor_type.shape.dim] if info is not None else []
    if len(dims) != 4 or 0 in dims[2:]:
        raise ValueError(f"{name}: a global average pool whose input's height and width are not known.")
    return dims[2:]
