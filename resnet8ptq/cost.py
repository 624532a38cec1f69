"""What a quantized model costs in the two measures a mixed-precision budget is set in: **weight memory**
(bits of the conv/gemm weights: parameters x their width; biases, 32-bit in every backend, are left out) and
**bit operations** (BOPs: per conv/gemm layer, its multiply-accumulates x its weights' width x the width of
the activation it reads; AIMET's and HAWQ-V3's measure, one image). Both come from the widths a
configuration gives each layer (:func:`configured_widths`), which the run's read-back checks confirm in the
saved model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from resnet8ptq.model import layer_name
from resnet8ptq.spec import RAISED_BITS, QuantSpec
from resnet8ptq.weight_grid import quantized_weights


@dataclass(frozen=True)
class LayerShape:
    """A conv/gemm layer: its weight's layer name, the activation layer it reads, its multiply-accumulates
    per image and its weight's parameter count."""

    weight: str
    reads: str
    macs: int
    params: int


@dataclass(frozen=True)
class ModelCost:
    """Weight memory and bit operations of one configuration."""

    weight_memory_bits: int
    bops: int

    def metrics(self) -> dict[str, float]:
        return {"weight_memory_bits": float(self.weight_memory_bits), "bops": float(self.bops)}


def layer_shapes(model: onnx.ModelProto) -> list[LayerShape]:
    """Every conv/gemm layer of the model with its MACs for one image (ONNX shape inference) and the
    activation layer it reads (back through ops that take their input's quantization: the one that decides
    its input's width)."""
    from resnet8ptq.layers import sharing

    inferred = onnx.shape_inference.infer_shapes(model)
    dims = {
        value.name: [d.dim_value or 1 for d in value.type.tensor_type.shape.dim]
        for value in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    origins = sharing(model)  # a reshape of a pool of a ReLU reads the ReLU's quantization
    shapes = []
    for name, (node, weight) in quantized_weights(model).items():
        out = dims.get(node.output[0])
        if out is None:
            raise RuntimeError(f"Shape inference gave no shape for {node.output[0]}.")
        if node.op_type == "Conv":  # weight: out x in/groups x kh x kw; output: N x out x H x W
            macs = int(np.prod(weight.shape)) * int(np.prod(out[2:]))
        else:  # Gemm/MatMul: every weight once per row of the output
            macs = int(np.prod(weight.shape)) * int(np.prod(out[1:-1] or [1]))
        reads = layer_name(node.input[0])
        shapes.append(LayerShape(layer_name(name), origins.get(reads, reads), macs, int(weight.size)))
    return shapes


def model_cost(
    shapes: list[LayerShape], weight_bits: dict[str, int], activation_bits: dict[str, int]
) -> ModelCost:
    """Weight memory and BOPs of the layers ``shapes`` at ``weight_bits`` (by weight layer) and
    ``activation_bits`` (by the activation layer each reads)."""
    memory = sum(shape.params * weight_bits[shape.weight] for shape in shapes)
    bops = sum(shape.macs * weight_bits[shape.weight] * activation_bits[shape.reads] for shape in shapes)
    return ModelCost(memory, bops)


def configured_widths(
    model: onnx.ModelProto, spec: QuantSpec, shapes: list[LayerShape]
) -> tuple[dict[str, int], dict[str, int]]:
    """The widths ``spec`` gives the layers of ``shapes``, as :func:`model_cost` takes them: each weight
    layer's (:func:`resnet8ptq.layers.weight_widths`; 16 bits when raised; 7 with ``reduce_range``) and each
    read activation's (:func:`resnet8ptq.layers.activation_width`)."""
    from resnet8ptq.layers import activation_width, weight_widths

    widths = {layer_name(name): bits for name, bits in weight_widths(model, spec).items()}
    weight_bits = {}
    for shape in shapes:
        bits = RAISED_BITS if shape.weight in spec.raised_layers else widths[shape.weight]
        weight_bits[shape.weight] = 7 if spec.reduce_range and bits == 8 else bits
    activation_bits = {shape.reads: activation_width(shape.reads, model, spec) for shape in shapes}
    return weight_bits, activation_bits


def configured_cost(model: onnx.ModelProto, spec: QuantSpec) -> ModelCost:
    """The cost of the widths ``spec`` gives each layer of ``model`` (:func:`configured_widths`)."""
    shapes = layer_shapes(model)
    return model_cost(shapes, *configured_widths(model, spec, shapes))
