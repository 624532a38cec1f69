"""The PT2E quantizer (X86InductorQuantizer with ORT-equivalent observers) and calibration of a model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import fx
from torchao.quantization.pt2e.quantizer import QuantizationConfig, QuantizationSpec, SharedQuantizationSpec
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer

from resnet8ptq.backends.base import QuantSpec, TensorRange
from resnet8ptq.backends.torch.observers import (
    TORCH_DTYPES,
    OrtActivationObserver,
    OrtWeightObserver,
)
from resnet8ptq.backends.torch.private_api import QUANT_ANNOTATION_KEY, x86_annotation
from resnet8ptq.backends.torch.program import is_zero_pad
from resnet8ptq.calibration import CalibConfig, batches


def quantization_config(spec: QuantSpec) -> QuantizationConfig:
    """A QuantizationConfig for X86InductorQuantizer: ORT-style observers, the spec's types and widths."""
    act_storage, weight_storage = spec.dtype.storage
    act_dtype, weight_dtype = TORCH_DTYPES[act_storage], TORCH_DTYPES[weight_storage]
    qmin, qmax = spec.dtype.activation_range()
    activation = QuantizationSpec(
        dtype=act_dtype,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=OrtActivationObserver.with_args(calib=spec.calib),
    )
    symmetric = spec.dtype.weight_symmetric(spec.per_channel)
    wmin, wmax = spec.dtype.weight_range(symmetric, spec.reduce_range)
    # X86InductorQuantizer accepts only *symmetric* weight qschemes in the spec; the observer sets the
    # effective one (affine for per-tensor uint8, as ORT does), and convert_pt2e reads it from the observer.
    weight = QuantizationSpec(
        dtype=weight_dtype,
        quant_min=wmin,
        quant_max=wmax,
        qscheme=torch.per_channel_symmetric if spec.per_channel else torch.per_tensor_symmetric,
        ch_axis=0 if spec.per_channel else None,
        observer_or_fake_quant_ctr=OrtWeightObserver.with_args(
            symmetric=symmetric, per_channel=spec.per_channel, ch_axis=0
        ),
    )
    return QuantizationConfig(activation, activation, weight, None, is_qat=False)


class OrtAlignedX86Quantizer(X86InductorQuantizer):
    """X86InductorQuantizer, except that a zero pad feeding a quantized op is quantized with its input's
    parameters. onnx2torch splits ONNX's asymmetric Conv padding into pad + conv; ORT calibrates the
    Conv input (the unpadded tensor), so the torch range must come from the unpadded tensor too."""

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        super().annotate(model)
        for pad in [n for n in model.graph.nodes if is_zero_pad(n)]:
            self._share_through_pad(pad)
        return model

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


def make_quantizer(spec: QuantSpec) -> OrtAlignedX86Quantizer:
    """X86InductorQuantizer (conv/linear/add/relu fusion patterns) with the spec's config."""
    return OrtAlignedX86Quantizer().set_global(quantization_config(spec))


def _module_path(node: fx.Node) -> str | None:
    """The onnx2torch module (= ONNX node name) a traced node came from."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else None


def _tensor_name(node: fx.Node, onnx_outputs: dict[str, str]) -> str:
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
            observers[_tensor_name(node.args[0], onnx_outputs)] = module
    return observers


def calibrate(prepared: fx.GraphModule, images: np.ndarray, calib: CalibConfig) -> None:
    """Run the calibration batches (``calibration.batches`` order) through the observed model."""
    from tqdm import tqdm

    total = math.ceil(len(images) / calib.batch_size)
    with torch.no_grad():
        for batch in tqdm(batches(images, calib.batch_size), total=total, desc="calibrate", unit="batch"):
            prepared(torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)))


def compute_ranges(observers: dict[str, OrtActivationObserver]) -> list[TensorRange]:
    """Each observer's calibrated range (entropy/percentile histograms are evaluated here)."""
    return [TensorRange(name, *obs.compute_range()) for name, obs in observers.items()]
