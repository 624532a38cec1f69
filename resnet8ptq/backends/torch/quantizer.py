"""The PT2E quantizer (X86InductorQuantizer with ORT-equivalent observers, layers raised to 16 bits and the
first and last layers at ``dtype.first_last_bits`` by their annotations) and calibration of a model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import fx
from torchao.quantization.pt2e.quantizer import QuantizationConfig, QuantizationSpec, SharedQuantizationSpec
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

from resnet8ptq.backends.torch.convert import onnx_module
from resnet8ptq.backends.torch.observers import (
    TORCH_DTYPES,
    OrtActivationObserver,
    OrtWeightObserver,
)
from resnet8ptq.backends.torch.private_api import QUANT_ANNOTATION_KEY, x86_annotation
from resnet8ptq.backends.torch.program import WEIGHTED_OPS, is_zero_pad, qdq_op
from resnet8ptq.calibration import CalibConfig, batches
from resnet8ptq.dtype import integer_range
from resnet8ptq.errors import Unsupported
from resnet8ptq.model import layer_name
from resnet8ptq.spec import RAISED_BITS, QuantSpec, TensorRange


def quantization_config(spec: QuantSpec) -> QuantizationConfig:
    """A QuantizationConfig for X86InductorQuantizer: ORT-style observers, the spec's types and widths."""
    activation = activation_qspec(spec, spec.dtype.storage[0], spec.dtype.activation_range())
    symmetric = spec.dtype.weight_symmetric(spec.per_channel)
    weight = weight_qspec(spec, spec.dtype.weight, spec.dtype.weight_range(symmetric, spec.reduce_range))
    return QuantizationConfig(activation, activation, weight, None, is_qat=False)


def activation_qspec(spec: QuantSpec, storage: str, qrange: tuple[int, int]) -> QuantizationSpec:
    """A per-tensor affine activation spec in ``storage`` over the integer range ``qrange``."""
    return QuantizationSpec(
        dtype=TORCH_DTYPES[storage],
        quant_min=qrange[0],
        quant_max=qrange[1],
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=OrtActivationObserver.with_args(calib=spec.calib),
    )


def weight_qspec(
    spec: QuantSpec, storage: str, qrange: tuple[int, int], symmetric: bool | None = None
) -> QuantizationSpec:
    """A weight spec in ``storage`` over ``qrange``, per channel or per tensor; ``symmetric`` (None: ORT's
    rule for the `dtype` choice, :meth:`DtypeConfig.weight_symmetric`)."""
    if symmetric is None:
        symmetric = spec.dtype.weight_symmetric(spec.per_channel)
    # X86InductorQuantizer accepts only *symmetric* weight qschemes in the spec; the observer sets the
    # effective one (affine for per-tensor uint8, as ORT does), and convert_pt2e reads it from the observer.
    return QuantizationSpec(
        dtype=TORCH_DTYPES[storage],
        quant_min=qrange[0],
        quant_max=qrange[1],
        qscheme=torch.per_channel_symmetric if spec.per_channel else torch.per_tensor_symmetric,
        ch_axis=0 if spec.per_channel else None,
        observer_or_fake_quant_ctr=OrtWeightObserver.with_args(
            symmetric=symmetric, per_channel=spec.per_channel, ch_axis=0, method=spec.calib.weights
        ),
    )


class OrtAlignedX86Quantizer(X86InductorQuantizer):
    """X86InductorQuantizer, except that a zero pad feeding a quantized op is quantized with its input's
    parameters (onnx2torch splits ONNX's asymmetric Conv padding into pad + conv; ORT calibrates the
    Conv input, the unpadded tensor, so the torch range must come from the unpadded tensor too), and that
    the layers of their own width (``layer_specs`` by layer name: raised to 16 bits, the first and last
    layers at ``dtype.first_last_bits``) are annotated with those specs; each of ``required`` must be found
    (the others are layers that take their quantization, e.g. a reshape of it, which the X86 recipe may
    quantize on its own: given the same width, as ORT's shared parameters give it).

    ``onnx_outputs`` maps each ONNX node name to its output tensor, ``weight_layers`` each conv/gemm node name
    to its weight's layer name: how the annotated edges are named.
    """

    def __init__(
        self,
        onnx_outputs: dict[str, str] | None = None,
        weight_layers: dict[str, str] | None = None,
        layer_specs: dict[str, QuantizationSpec] | None = None,
        required: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__()
        self.onnx_outputs = onnx_outputs or {}
        self.weight_layers = weight_layers or {}
        self.layer_specs = layer_specs or {}
        self.required = required

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        super().annotate(model)
        for pad in [n for n in model.graph.nodes if is_zero_pad(n)]:
            self._share_through_pad(pad)
        for node in model.graph.nodes:
            self._quantize_global_mean(node)
        if self.layer_specs:
            self._annotate_widths(model)
        return model

    def layer_nodes(self, graph: fx.Graph) -> dict[str, tuple[str, str]]:
        """Node name -> (kind, layer) for the ops of a converted program that store a layer: each activation
        ``quantize_per_tensor`` (zero pads carry their input's) and each conv/linear (its weight). Read
        before saving, which drops the module metadata the names come from; saving keeps node names."""
        found = {}
        for node in graph.nodes:
            if qdq_op(node) == "quantize_per_tensor" and not is_zero_pad(node.args[0]):
                found[node.name] = ("activation", layer_name(tensor_name(node.args[0], self.onnx_outputs)))
            elif node.op == "call_function" and node.target in WEIGHTED_OPS:
                found[node.name] = ("weight", self.weight_layers.get(onnx_module(node) or "", node.name))
        return found

    def _annotate_widths(self, model: fx.GraphModule) -> None:
        """Give every edge of a layer of its own width its spec: the activation where its consumers quantize
        it (edges that share another's parameters follow it), the weight where its conv/linear reads it."""
        done: set[str] = set()
        for node in model.graph.nodes:
            annotation = node.meta.get(QUANT_ANNOTATION_KEY)
            if annotation is None:
                continue
            for source, qspec in list(annotation.input_qspec_map.items()):
                if not isinstance(qspec, QuantizationSpec):
                    continue
                if source.op == "get_attr":  # a weight: named after the ONNX node that reads it
                    name = self.weight_layers.get(onnx_module(node) or "")
                else:
                    name = layer_name(tensor_name(source, self.onnx_outputs))
                if name in self.layer_specs:
                    annotation.input_qspec_map[source] = self.layer_specs[name]
                    done.add(name)
        missing = sorted(set(self.required) - done)
        if missing:
            raise Unsupported(
                f"raised_layers, layer_bits or dtype.first_last_bits: {missing} are not quantized by the "
                f"PyTorch recipe (X86InductorQuantizer); "
                f"analysis/layer_sqnr.csv of a torch run lists the layers it quantizes."
            )

    def _quantize_global_mean(self, node: fx.Node) -> None:
        """A global average pool (onnx2torch's GlobalAveragePool: ``aten.mean.dim``), which the X86 recipe
        leaves in float: its input and its output quantized, each with its own range, as ONNX Runtime's QDQ
        model quantizes them (the integer device then computes it as a pool)."""
        if node.op != "call_function" or node.target != torch.ops.aten.mean.dim:
            return
        if node.meta.get(QUANT_ANNOTATION_KEY) is not None or self.global_config is None:
            return
        activation = self.global_config.input_activation
        annotation = x86_annotation({node.args[0]: activation})
        annotation.output_qspec = activation
        node.meta[QUANT_ANNOTATION_KEY] = annotation

    @staticmethod
    def _share_through_pad(pad: fx.Node) -> None:
        if pad.meta.get(QUANT_ANNOTATION_KEY) is not None:
            return  # the X86 recipe annotated it itself
        source = pad.args[0]
        for user in pad.users:
            annotation = user.meta.get(QUANT_ANNOTATION_KEY)
            qspec = annotation.input_qspec_map.get(pad) if annotation else None
            if not isinstance(qspec, QuantizationSpec):
                continue
            pad.meta.setdefault(
                QUANT_ANNOTATION_KEY,
                x86_annotation({source: qspec}),
            )
            annotation.input_qspec_map[pad] = SharedQuantizationSpec((source, pad))


def make_quantizer(spec: QuantSpec, onnx_path: Path) -> OrtAlignedX86Quantizer:
    """X86InductorQuantizer (conv/linear/add/relu fusion patterns) with the spec's config, 16-bit specs for
    the spec's raised layers, specs of their own width for the ``layer_bits`` layers and
    ``dtype.first_last_bits`` specs for the first and last layers (names of
    ``onnx_path``'s layers)."""
    import onnx

    from resnet8ptq.layers import expected_raised, model_layers, own_widths, wide_layers
    from resnet8ptq.weight_grid import quantized_weights

    graph_model = onnx.load(str(onnx_path))
    layers = model_layers(graph_model)
    widths = dict.fromkeys(wide_layers(graph_model, spec), spec.dtype.first_last_bits)
    widths |= own_widths(graph_model, spec)
    specs = {}
    for name, bits in widths.items():
        if name not in layers:  # the graph input: torch sees its transpose
            continue
        if layers[name].kind == "activation":
            specs[name] = activation_qspec(spec, spec.dtype.storage[0], spec.dtype.activation_range(bits))
        else:
            symmetric = spec.dtype.weight_symmetric(spec.per_channel)
            qrange = spec.dtype.weight_range(symmetric, spec.reduce_range, bits)
            specs[name] = weight_qspec(spec, spec.dtype.weight, qrange)
    for name in expected_raised(spec.raised_layers, graph_model):
        storage = spec.raised_storage(layers[name].kind)
        if layers[name].kind == "activation":
            qrange = integer_range(storage, RAISED_BITS, symmetric=False)
            specs[name] = activation_qspec(spec, storage, qrange)
        else:
            specs[name] = weight_qspec(spec, storage, integer_range(storage, RAISED_BITS, True), True)
    onnx_outputs = {node.name: node.output[0] for node in graph_model.graph.node}
    weights = quantized_weights(graph_model)
    weight_layers = {node.name: layer_name(name) for name, (node, _) in weights.items()}
    required = frozenset(spec.raised_layers) | {name for name in specs if layers[name].kind == "weight"}
    quantizer = OrtAlignedX86Quantizer(onnx_outputs, weight_layers, specs, required)
    return quantizer.set_global(quantization_config(spec))


def _module_path(node: fx.Node) -> str | None:
    """The onnx2torch module (= ONNX node name) a traced node came from."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else None


def tensor_name(node: fx.Node, onnx_outputs: dict[str, str]) -> str:
    """The ONNX tensor a graph node computes (e.g. ``model_1/activation_1/Relu:0``), else the node name."""
    path = _module_path(node)
    return onnx_outputs.get(path, f"{path}:{node.name}" if path else node.name)


def activation_observers(prepared: fx.GraphModule, onnx_path: Path) -> dict[str, OrtActivationObserver]:
    """The prepared model's activation observers, keyed by the ONNX tensor each one observes."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    onnx_outputs = {n.name: n.output[0] for n in graph.node}
    observers: dict[str, OrtActivationObserver] = {}
    seen: set[int] = set()
    for node in prepared.graph.nodes:
        if node.op != "call_module":
            continue
        module = prepared.get_submodule(node.target)
        if isinstance(module, OrtActivationObserver) and id(module) not in seen:
            seen.add(id(module))
            observers[tensor_name(node.args[0], onnx_outputs)] = module
    return observers


def calibrate(prepared: fx.GraphModule, images: np.ndarray, calib: CalibConfig) -> None:
    """Run the calibration batches (``calibration.batches`` order) through the observed model, in float64:
    the observers see each activation rounded once to float32 from a value whose float64 error is far below
    float32's step, so the ranges do not depend on the CPU's float32 kernels (their order of summation)."""
    from tqdm import tqdm

    total = math.ceil(len(images) / calib.batch_size)
    prepared.double()
    try:
        with torch.no_grad():
            for batch in tqdm(batches(images, calib.batch_size), total=total, desc="calibrate", unit="batch"):
                prepared(torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float64)))
    finally:
        prepared.float()  # the float32 weights back as they were (float32 -> float64 -> float32 is exact)


def fix_learned_ranges(observers: dict[str, OrtActivationObserver], spec: QuantSpec) -> int:
    """Give the observers of tensors an `algo` step learned a range for (:attr:`QuantSpec.learned_ranges`)
    that range; returns how many. Tensors ORT stores and this recipe does not (a residual branch before
    its add) have no observer here."""
    fixed = 0
    for learned in spec.learned_ranges:
        if learned.tensor in observers:
            observers[learned.tensor].fix_range(learned.min, learned.max)
            fixed += 1
    return fixed


def compute_ranges(observers: dict[str, OrtActivationObserver]) -> list[TensorRange]:
    """Each observer's calibrated range (entropy/percentile/mse histograms are evaluated here)."""
    return [TensorRange(name, *obs.compute_range()) for name, obs in observers.items()]
