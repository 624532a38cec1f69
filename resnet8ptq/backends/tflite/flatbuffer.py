"""Reading a saved .tflite file (the flatbuffer, with the schema ``ai_edge_litert`` ships): its ops, its
weight and activation tensors with their quantization, and from them the effective types, widths, ranges and
every layer's precision, named as the canonical ONNX model names its layers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from resnet8ptq.dtype import bits_used
from resnet8ptq.model import INPUT_NAME, layer_name
from resnet8ptq.spec import LayerPrecision, TensorRange

OP_NAMES = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
TYPE_NAMES = {
    code: name.lower() for name, code in vars(schema.TensorType).items() if not name.startswith("_")
}
WEIGHTED_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"}  # input 1 is the weight
PREFERRED = ("/Relu", "/Add", "/add_1", "/BiasAdd")  # the last op of a fusion, by the suffix of its name


@dataclass(frozen=True)
class Tensor:
    """One tensor of the model: its name, storage type, shape, quantization (empty when float) and, for a
    constant, its stored values."""

    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    scales: np.ndarray
    zero_points: np.ndarray
    axis: int  # the quantized dimension of per-channel scales
    values: np.ndarray | None  # constants only

    def dequantized(self) -> np.ndarray:
        """The float values of a quantized constant (per channel along ``axis``)."""
        shape = [1] * len(self.shape)
        shape[self.axis] = -1
        scales, zero_points = self.scales.reshape(shape), self.zero_points.reshape(shape)
        return (self.values.astype(np.int64) - zero_points).astype(np.float32) * scales.astype(np.float32)


@dataclass(frozen=True)
class TFLiteModel:
    """The main subgraph of a .tflite file: ops (name, input and output tensor indices), tensors, and the
    indices of its input tensors."""

    ops: list[tuple[str, list[int], list[int]]]
    tensors: list[Tensor]
    inputs: list[int]
    options: list[object] = field(default_factory=list)  # each op's builtin options (schema's *OptionsT)

    @property
    def weights(self) -> list[Tensor]:
        """The constant weights of conv and fully-connected ops."""
        return [self.tensors[inputs[1]] for op, inputs, _ in self.ops if op in WEIGHTED_OPS]

    @property
    def activations(self) -> list[Tensor]:
        """Tensors computed by ops (and the model input) that hold floats or quantized integers (not the
        int32 shapes of the flatten)."""
        produced = set(self.inputs) | {index for _, _, outputs in self.ops for index in outputs}
        return [t for t in self.tensors if t.index in produced and (t.dtype == "float32" or len(t.scales))]

    def op_counts(self) -> Counter:
        return Counter(op for op, _, _ in self.ops)


def read(path: Path) -> TFLiteModel:
    """The main subgraph of the .tflite file at ``path``."""
    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    graph = model.subgraphs[0]
    ops, options = [], []
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        name = OP_NAMES[max(code.builtinCode, code.deprecatedBuiltinCode)]
        ops.append((name, [int(i) for i in op.inputs], [int(i) for i in op.outputs]))
        options.append(op.builtinOptions)
    tensors = []
    for index, tensor in enumerate(graph.tensors):
        dtype = TYPE_NAMES[tensor.type]
        shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
        quantization = tensor.quantization
        scales = np.asarray(_field(quantization, "scale", []), np.float32)
        data = model.buffers[tensor.buffer].data if tensor.buffer < len(model.buffers) else None
        values = None
        if data is not None and len(data):
            values = np.frombuffer(bytes(data), np.dtype(dtype)).reshape(shape)
        tensors.append(
            Tensor(
                index=index,
                name=tensor.name.decode(),
                dtype=dtype,
                shape=shape,
                scales=scales,
                zero_points=np.asarray(_field(quantization, "zeroPoint", [0] * len(scales)), np.int64),
                axis=int(_field(quantization, "quantizedDimension", 0)),
                values=values,
            )
        )
    return TFLiteModel(ops, tensors, [int(i) for i in graph.inputs], options)


def _field(quantization: object, name: str, default: object) -> object:
    """A field of a tensor's quantization parameters (absent for float tensors)."""
    value = getattr(quantization, name, None)
    return default if value is None else value


def check_fully_quantized(model: TFLiteModel) -> None:
    """Raise unless every quantized activation has one integer type and every conv/fully-connected weight one
    integer type: else the model is not fully quantized."""
    activation = {t.dtype for t in model.activations if len(t.scales)}
    weight = {t.dtype for t in model.weights}
    if len(activation) != 1 or len(weight) != 1 or "float32" in activation | weight:
        floats = sorted(t.name for t in model.activations if t.dtype == "float32")
        raise RuntimeError(
            f"Expected one activation and one weight integer type in the .tflite model, found activations "
            f"{sorted(activation)}, weights {sorted(weight)}, float tensors {floats[:3]}: not fully "
            f"quantized."
        )


def weight_granularity(model: TFLiteModel) -> str:
    """``per-channel`` when every weight has one scale per output channel, ``per-tensor`` when every weight
    has one scale, else how many of each, naming the per-tensor ones (tag ``weight_granularity``)."""
    per_tensor = [t.name for t in model.weights if len(t.scales) == 1]
    if not per_tensor:
        return "per-channel"
    if len(per_tensor) == len(model.weights):
        return "per-tensor"
    per_channel = len(model.weights) - len(per_tensor)
    return f"per-channel x{per_channel}, per-tensor x{len(per_tensor)} ({', '.join(per_tensor)})"


def quantized_ranges(model: TFLiteModel) -> list[TensorRange]:
    """The float range each quantized activation can hold, from its scale and zero point: the range the
    converter calibrated, widened to include 0 and to a whole number of steps."""
    ranges = []
    for tensor in model.activations:
        if len(tensor.scales) != 1:
            continue
        info = np.iinfo(tensor.dtype)
        scale, zero_point = float(tensor.scales[0]), int(tensor.zero_points[0])
        ranges.append(
            TensorRange(tensor.name, (info.min - zero_point) * scale, (info.max - zero_point) * scale)
        )
    return ranges


def tflite_layer_name(model: TFLiteModel, index: int) -> str:
    """The layer name of tensor ``index`` as tf2onnx names the canonical ONNX model's: the converter names a
    tensor after the TF ops it fused (``model_1/activation_1/Relu;model_1/batch_normalization_1/...``); the
    last of them (:data:`PREFERRED`, else the first listed) names it. The model input is ``input``, as in the
    ONNX model; a tensor without TF name (the model output) is named after the op producing it."""
    if index in model.inputs:
        return INPUT_NAME
    parts = model.tensors[index].name.split(";")
    chosen = next((part for suffix in PREFERRED for part in parts if part.endswith(suffix)), parts[0])
    if "/" not in chosen:
        return next(op.lower() for op, _, outputs in model.ops if index in outputs)
    return layer_name(chosen)


def layer_precision(model: TFLiteModel) -> list[LayerPrecision]:
    """Every quantized layer as stored: activations by their type (TFLite quantizes to its bounds: its
    bits), conv/fully-connected weights by their type and the fewest bits holding the stored integers."""
    layers = [
        LayerPrecision(
            tflite_layer_name(model, t.index), "activation", t.dtype, 8 * np.dtype(t.dtype).itemsize
        )
        for t in model.activations
        if len(t.scales)
    ]
    for weight in model.weights:
        signed = np.issubdtype(weight.values.dtype, np.signedinteger)
        bits = bits_used(min(int(weight.values.min()), 0), max(int(weight.values.max()), 0), signed)
        layers.append(LayerPrecision(layer_name(weight.name), "weight", weight.dtype, bits))
    return layers
