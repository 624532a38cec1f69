"""Layers of the canonical model as both backends and the per-layer SQNR analysis name them, and the rules of
layers whose width is not the model's: mixed precision (`raised_layers`: which names exist, which layers take
their input's quantization and so follow it when it is raised, which layers a saved model really holds at 16
bits) and the papers' first/last-layer convention (`dtype.first_last_bits`), and layers of their own narrow
width (`layer_bits`, e.g. a budgeted mix: :mod:`resnet8ptq.search.budget`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from resnet8ptq.dtype import ACTIVATION_BITS, WEIGHT_BITS
from resnet8ptq.errors import RaisedLayerError
from resnet8ptq.model import layer_name
from resnet8ptq.spec import RAISED_BITS, LayerPrecision, QuantSpec
from resnet8ptq.weight_grid import WEIGHT_INPUTS, quantized_weights

SHARING_OPS = {"AveragePool", "Flatten", "MaxPool", "Reshape", "Slice", "Squeeze", "Transpose", "Unsqueeze"}
"""Ops whose output ORT quantizes with its input's parameters (``QDQDirect8BitOp``, ``QDQMaxPool``); the
PT2E recipe shares them too (``SharedQuantizationSpec``). Raising such an output alone changes nothing."""


@dataclass(frozen=True)
class Layer:
    """A layer that can be quantized: an activation tensor or a conv/gemm weight of the canonical model."""

    name: str  # layer_name() of the tensor: what analysis/layer_sqnr.csv calls it
    kind: str  # "activation" | "weight"
    tensor: str  # the ONNX tensor name


def model_layers(model: onnx.ModelProto) -> dict[str, Layer]:
    """Every activation tensor (node outputs) and conv/gemm weight of the model, by layer name."""
    layers: dict[str, Layer] = {}
    weights = {name: Layer(layer_name(name), "weight", name) for name in quantized_weights(model)}
    activations = [
        Layer(layer_name(tensor), "activation", tensor) for node in model.graph.node for tensor in node.output
    ]
    for layer in [*weights.values(), *activations]:
        if layer.name in layers and layers[layer.name].tensor != layer.tensor:
            raise RuntimeError(f"Two tensors of the model are both called layer {layer.name!r}.")
        layers[layer.name] = layer
    return layers


def sharing(model: onnx.ModelProto) -> dict[str, str]:
    """Activation layer -> the layer whose quantization it takes (followed to the end of a chain, e.g.
    flatten_1/Reshape -> average_pooling2d_1/AvgPool -> activation_6_1/Relu). Outputs of graph inputs are
    quantized on their own."""
    produced = {tensor for node in model.graph.node for tensor in node.output}
    source = {
        layer_name(node.output[0]): layer_name(node.input[0])
        for node in model.graph.node
        if node.op_type in SHARING_OPS and node.input and node.input[0] in produced
    }
    resolved = {}
    for layer, origin in source.items():
        while origin in source:
            origin = source[origin]
        resolved[layer] = origin
    return resolved


def check_raised(names: Sequence[str], model: onnx.ModelProto, activation_bits: int) -> None:
    """Raise :class:`RaisedLayerError` unless every name is a layer that can be raised to 16 bits."""
    layers, shared = model_layers(model), sharing(model)
    unknown = [name for name in names if name not in layers]
    if unknown:
        known = ", ".join(sorted(name for name in layers if name not in shared))
        raise RaisedLayerError(
            f"raised_layers: {unknown} are not layers of this model. Its tensors (a run's "
            f"analysis/layer_sqnr.csv lists those its backend quantizes): {known}."
        )
    for name in names:
        if name in shared:
            origin = shared[name]
            raise RaisedLayerError(
                f"raised_layers: {name} takes the quantization of {origin}; raise {origin} instead."
            )
        if layers[name].kind == "activation" and activation_bits >= RAISED_BITS:
            raise RaisedLayerError(
                f"raised_layers: {name} is an activation, and dtype.activation_bits={activation_bits} is "
                f"already {RAISED_BITS} bits; raise weights only."
            )


def expected_raised(names: Iterable[str], model: onnx.ModelProto) -> set[str]:
    """The layers a model quantized with ``names`` raised must hold at 16 bits: those, and every layer that
    takes one of their quantizations."""
    raised = set(names)
    return raised | {layer for layer, origin in sharing(model).items() if origin in raised}


def raised_in(layers: Iterable[LayerPrecision], activation_bits: int) -> list[str]:
    """The layers a saved model holds at 16 bits beyond its configuration, in model order: weights wider than
    8 bits (a width's range may need one more bit than configured, e.g. uint8 holding 0..128 for 7-bit
    per-channel weights, never more), activations wider than 8 bits and than ``dtype.activation_bits``."""
    limit = {"activation": max(8, activation_bits), "weight": 8}
    return [layer.layer for layer in layers if layer.bits > limit[layer.kind]]


def first_last_layers(model: onnx.ModelProto) -> set[str]:
    """The layers the papers' convention keeps wider (``dtype.first_last_bits``): the weights of the first and
    the last conv/gemm layer and the activations they read, followed back through ops that take their
    input's quantization (the dense layer reads a flatten of the average pool of the last ReLU: that ReLU
    and all three) and up to the graph input (a transpose of the image)."""
    layers = set()
    for node in end_layers(model).values():
        layers |= {weight_layer(node)} | read_layers(model, node)
    return layers


def end_layers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """The first and the last conv/gemm node, as ``{"first": ..., "last": ...}``."""
    weighted = [node for node in model.graph.node if node.op_type in WEIGHT_INPUTS]
    return {"first": weighted[0], "last": weighted[-1]}


def weight_layer(node: onnx.NodeProto) -> str:
    """The layer name of a conv/gemm node's weight."""
    return layer_name(node.input[WEIGHT_INPUTS[node.op_type]])


def wide_layers(model: onnx.ModelProto, spec: QuantSpec) -> set[str]:
    """The layers at ``dtype.first_last_bits`` (:func:`first_last_layers`; none when it is null)."""
    return first_last_layers(model) if spec.dtype.first_last_bits is not None else set()


def check_first_last(layers: Sequence[LayerPrecision], model: onnx.ModelProto, spec: QuantSpec) -> str | None:
    """Fail unless a saved model (its ``layers`` read back) holds the first and last layers' weights and at
    least one activation read by each at ``dtype.first_last_bits``; what it holds there, as the run's tag
    ``dtype.first_last`` (None without the convention)."""
    bits = spec.dtype.first_last_bits
    if bits is None:
        return None
    wide = first_last_layers(model)
    found = [layer for layer in layers if layer.layer in wide]
    wrong = [f"{layer.kind} {layer.layer}: {layer.bits} bits" for layer in found if layer.bits != bits]
    ends = end_layers(model)
    held = {layer.layer for layer in found}
    missing = [weight_layer(node) for node in ends.values() if weight_layer(node) not in held]
    read = {layer.layer for layer in found if layer.kind == "activation"}
    unread = [end for end, node in ends.items() if not read & read_layers(model, node)]
    problems = [
        *wrong,
        *(f"weight {name} not quantized" for name in missing),
        *(f"no quantized input of the {end} layer" for end in unread),
    ]
    if problems:
        raise RuntimeError(
            f"dtype.first_last_bits={bits}: the saved model does not hold the first and last layers at "
            f"{bits} bits: {'; '.join(problems)}."
        )
    names = ", ".join(sorted(layer.layer for layer in found))
    return f"{bits} bits (read back): {names}"


def read_layers(model: onnx.ModelProto, node: onnx.NodeProto) -> set[str]:
    """The activation layers ``node`` reads, back through ops that take their input's quantization."""
    producers = {tensor: producer for producer in model.graph.node for tensor in producer.output}
    found, tensor = set(), node.input[0]
    while True:
        found.add(layer_name(tensor))
        producer = producers.get(tensor)
        if producer is None or producer.op_type not in SHARING_OPS:
            return expected_raised(found, model)
        tensor = producer.input[0]


def weight_widths(model: onnx.ModelProto, spec: QuantSpec) -> dict[str, int]:
    """Every conv/gemm weight's width (initializer name -> bits): its own (``layer_bits``) when it has one,
    ``dtype.first_last_bits`` for the first and last layers when set, else ``dtype.weight_bits`` (layers
    raised to 16 bits are not counted here)."""
    own, wide = dict(spec.layer_bits), wide_layers(model, spec)
    widths = {}
    for name in quantized_weights(model):
        layer = layer_name(name)
        wide_bits = spec.dtype.first_last_bits if layer in wide else None
        widths[name] = own.get(layer) or wide_bits or spec.dtype.weight_bits
    return widths


def activation_width(layer: str, model: onnx.ModelProto, spec: QuantSpec) -> int:
    """The width of an activation layer that narrow widths apply to (not the logits): 16 bits when raised,
    its own (``layer_bits``, also for the layers that take its quantization), ``dtype.first_last_bits`` for
    the inputs of the first and last layers when set, else ``dtype.activation_bits``."""
    if layer in expected_raised(spec.raised_layers, model):
        return RAISED_BITS
    own = own_widths(model, spec)
    if layer in own:
        return own[layer]
    if layer in wide_layers(model, spec):
        return spec.dtype.first_last_bits
    return spec.dtype.activation_bits


def own_widths(model: onnx.ModelProto, spec: QuantSpec) -> dict[str, int]:
    """The layers of their own width (``layer_bits``) and those that take their quantization, -> bits."""
    own = dict(spec.layer_bits)
    return own | {layer: own[origin] for layer, origin in sharing(model).items() if origin in own}


def check_layer_bits(spec: QuantSpec, model: onnx.ModelProto) -> None:
    """Raise :class:`RaisedLayerError` unless every ``layer_bits`` name is a layer of the model with
    quantization of its own, its width one its kind can take, and not one the papers' convention fixes."""
    layers, shared = model_layers(model), sharing(model)
    names = [name for name, _ in spec.layer_bits]
    unknown = [name for name in names if name not in layers]
    if unknown:
        known = ", ".join(sorted(name for name in layers if name not in shared))
        raise RaisedLayerError(f"layer_bits: {unknown} are not layers of this model. Its layers: {known}.")
    fixed = wide_layers(model, spec)
    for name, bits in spec.layer_bits:
        if name in shared:
            raise RaisedLayerError(
                f"layer_bits: {name} takes the quantization of {shared[name]}; set {shared[name]} instead."
            )
        if name in fixed:
            raise RaisedLayerError(
                f"layer_bits: {name} is a first or last layer, kept at dtype.first_last_bits="
                f"{spec.dtype.first_last_bits}; leave it out or set dtype.first_last_bits=null."
            )
        allowed = WEIGHT_BITS if layers[name].kind == "weight" else [b for b in ACTIVATION_BITS if b <= 8]
        if bits not in allowed:
            raise RaisedLayerError(
                f"layer_bits: {name}={bits}: {layers[name].kind}s take {min(allowed)}..{max(allowed)} bits."
            )
        if layers[name].kind == "activation" and spec.dtype.activation_bits > 8:
            raise RaisedLayerError(
                f"layer_bits: {name} is an activation, and dtype.activation_bits="
                f"{spec.dtype.activation_bits}: narrow activations need dtype.activation_bits <= 8."
            )
    logits = logit_layers(model)
    if named := sorted(set(names) & logits):
        raise RaisedLayerError(
            f"layer_bits: {named} are the logits or follow them, which keep the storage type's 8 bits."
        )


def logit_layers(model: onnx.ModelProto) -> set[str]:
    """The activation layers from the last conv/gemm's output on (the logits, the softmax)."""
    last = max(i for i, node in enumerate(model.graph.node) if node.op_type in WEIGHT_INPUTS)
    return {layer_name(name) for node in model.graph.node[last:] for name in node.output}


def check_own_widths(layers: Sequence[LayerPrecision], model: onnx.ModelProto, spec: QuantSpec) -> str | None:
    """Fail unless a saved model (its ``layers`` read back) holds every ``layer_bits`` layer, and those that
    take their quantization where it stores them, at its width; what it holds, as the run's tag
    ``layer_bits`` (None without any)."""
    if not spec.layer_bits:
        return None
    own = own_widths(model, spec)
    found = [layer for layer in layers if layer.layer in own]
    wrong = [f"{layer.kind} {layer.layer}: {layer.bits} bits, not {own[layer.layer]}" for layer in found
             if layer.bits != own[layer.layer]]  # fmt: skip
    missing = sorted({name for name, _ in spec.layer_bits} - {layer.layer for layer in found})
    problems = [*wrong, *(f"{name} not quantized by this backend's recipe" for name in missing)]
    if problems:
        raise RuntimeError(
            f"layer_bits: the saved model does not hold its layers' widths: {'; '.join(problems)}."
        )
    return ", ".join(sorted(f"{layer.layer}={layer.bits}" for layer in found))
