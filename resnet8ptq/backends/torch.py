"""PyTorch backend: onnx2torch FP32 model, torchao PT2E static quantization, torch.export ``.pt2`` files.

Flow: ONNX → onnx2torch GraphModule (Reshape made static so torch.export can trace it) → torch.export →
``prepare_pt2e`` with :class:`~torchao.quantization.pt2e.quantizer.X86InductorQuantizer` and a custom
QuantizationConfig → calibration → ``convert_pt2e`` → torch.export → ``torch.export.save``.

Calibration means what it means in the ONNX Runtime backend: every activation observer hands its tensor to
:class:`resnet8ptq.calibration.RangeCollector` (ORT's MinMax / HistogramCollector algorithms) and turns the
range into scale/zero point with ORT's ``compute_scale_zp``; weights get plain min/max, with ORT's symmetry
rule (:func:`ort_weight_symmetric`).

The reference form is the converted program run eagerly (float quantize/dequantize: the exact quantized
numerics). The runtime form, for uint8 activations with int8 weights (the only pair x86 int8 kernels take), is
the program compiled by inductor into oneDNN int8 kernels, used when inductor lowers every conv/linear layer;
the pipeline then checks it against the reference on the test set (:mod:`resnet8ptq.execution`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx
from torchao.quantization.pt2e.observer import UniformQuantizationObserverBase
from torchao.quantization.pt2e.quantizer import QuantizationConfig, QuantizationSpec, SharedQuantizationSpec
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    QUANT_ANNOTATION_KEY,
    X86InductorQuantizer,
    _X86InductorQuantizationAnnotation,
)

from resnet8ptq.backends.base import (
    Backend,
    LayerError,
    Model,
    Predictor,
    QuantizedModel,
    QuantSpec,
    Runtime,
    TensorRange,
)
from resnet8ptq.calibration import CalibSpec, RangeCollector, batches

log = logging.getLogger(__name__)

PREDICT_BATCH = 500
"""Images per forward pass in a predictor (bounds activation memory for large inputs)."""
EXAMPLE_BATCH = 2
"""Images in the example input given to torch.export (batch 1 would specialise the batch dimension)."""

_QDTYPES = {"int8": torch.int8, "uint8": torch.uint8}


# --------------------------------------------------------------------------------------------- FP32 model


class StaticReshape(torch.nn.Module):
    """ONNX Reshape with a constant target shape (0 copies the input dimension, -1 is inferred)."""

    def __init__(self, shape: list[int]) -> None:
        super().__init__()
        self.shape = tuple(int(d) for d in shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(self.shape)])


def _make_reshapes_static(gm: fx.GraphModule) -> int:
    """Replace onnx2torch's OnnxReshape (a data-dependent ``torch.any(shape == 0)`` check that breaks
    torch.export) by :class:`StaticReshape` wherever the shape is a constant. Returns the count replaced."""
    from onnx2torch.node_converters.reshape import OnnxReshape

    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(gm.get_submodule(node.target), OnnxReshape):
            continue
        shape_node = node.args[1]
        if not isinstance(shape_node, fx.Node) or shape_node.op != "get_attr":
            raise RuntimeError(f"Reshape {node.target}: the target shape is computed, not a constant.")
        shape = _get_attr(gm, shape_node.target)
        gm.add_submodule(node.target, StaticReshape(shape.tolist()))
        node.args = (node.args[0],)
        replaced += 1
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return replaced


def _get_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, name)


def onnx_to_torch(onnx_path: Path) -> fx.GraphModule:
    """The canonical ONNX model as an eval-mode torch GraphModule that torch.export can trace."""
    import onnx
    from onnx2torch import convert

    gm = convert(onnx.load(str(onnx_path))).eval()
    _make_reshapes_static(gm)
    for tensor in [*gm.parameters(), *gm.buffers()]:
        tensor.data = tensor.data.contiguous()  # onnx2torch transposes Gemm weights into a view
        tensor.requires_grad_(False)
    return gm


def export(module: torch.nn.Module, example: tuple[torch.Tensor]) -> torch.export.ExportedProgram:
    """torch.export with a dynamic batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    return torch.export.export(module, example, dynamic_shapes=({0: batch},))


def make_predictor(module: Any, batch_size: int = PREDICT_BATCH) -> Predictor:
    """NHWC float32 numpy → probabilities numpy, batch by batch under inference mode."""

    def predict(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=np.float32)
        outputs = []
        with torch.inference_mode():
            for start in range(0, len(images), batch_size):
                chunk = torch.from_numpy(np.ascontiguousarray(images[start : start + batch_size]))
                outputs.append(module(chunk).numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 10), np.float32)

    return predict


def load_program(path: Path) -> torch.export.ExportedProgram:
    """Load a ``.pt2``; imports torchao's PT2E module first so the quantized ops are registered."""
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed ops)

    return torch.export.load(str(path))


def load_quantized(path: str | Path) -> Predictor:
    """A predictor for a ``.pt2`` saved by :class:`TorchBackend` (FP32 or quantized)."""
    return make_predictor(load_program(Path(path)).module())


# ------------------------------------------------------------------------------------------- observers


def _ort_qrange(
    dtype: torch.dtype, symmetric: bool, reduce_range: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """ORT's (qmin, qmax) for a dtype: int8 symmetric is [-127, 127], otherwise the full range; with
    ``reduce_range`` one bit less (int8 [-64, 64], uint8 [0, 127]), as ORT quantizes weights then."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qtype = TensorProto.INT8 if dtype == torch.int8 else TensorProto.UINT8
    return get_qmin_qmax_for_qType(qtype, reduce_range=reduce_range, symmetric=symmetric)


def ort_weight_symmetric(dtype: torch.dtype, per_channel: bool) -> bool:
    """ORT's weight symmetry in QDQ models: symmetric for signed types (``WeightSymmetric``'s default) and
    for every per-channel weight (QLinear ops need one zero point in all channels), so only per-tensor uint8
    weights are asymmetric."""
    return dtype == torch.int8 or per_channel


def ort_scale_zero_point(
    rmin: float, rmax: float, dtype: torch.dtype, symmetric: bool, reduce_range: bool = False
) -> tuple[float, int]:
    """Scale and zero point exactly as ORT's ``compute_scale_zp`` (the range is extended to include 0)."""
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    qmin, qmax = _ort_qrange(dtype, symmetric, reduce_range)
    zero_point, scale = compute_scale_zp(
        np.array(rmin, np.float32), np.array(rmax, np.float32), qmin, qmax, symmetric
    )
    return float(scale), int(zero_point)


class OrtActivationObserver(UniformQuantizationObserverBase):
    """Per-tensor affine activation observer whose range is computed by :class:`RangeCollector`."""

    def __init__(self, calib: CalibSpec, dtype: torch.dtype = torch.uint8, **kwargs: Any) -> None:
        qmin, qmax = _ort_qrange(dtype, symmetric=False)  # ORT: ActivationSymmetric defaults to False
        kwargs.update(quant_min=int(qmin), quant_max=int(qmax), qscheme=torch.per_tensor_affine)
        kwargs.pop("ch_axis", None)
        super().__init__(dtype=dtype, **kwargs)
        self.collector = RangeCollector(calib)
        self._range: tuple[float, float] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.collector.add(x.detach().float().cpu().numpy())
        self._range = None
        return x

    def compute_range(self) -> tuple[float, float]:
        """The calibrated (min, max) of the observed tensor (computed once, then cached)."""
        if self._range is None:
            self._range = self.collector.compute()
        return self._range

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale, zero_point = ort_scale_zero_point(*self.compute_range(), self.dtype, symmetric=False)
        return torch.tensor([scale], dtype=torch.float32), torch.tensor([zero_point], dtype=torch.int64)


class OrtWeightObserver(UniformQuantizationObserverBase):
    """Weight min/max observer, per tensor or per channel (``ch_axis``), with ORT's symmetry rule and
    ``reduce_range``."""

    def __init__(
        self,
        dtype: torch.dtype = torch.int8,
        per_channel: bool = False,
        ch_axis: int = 0,
        reduce_range: bool = False,
        **kwargs: Any,
    ) -> None:
        symmetric = ort_weight_symmetric(dtype, per_channel)
        qmin, qmax = _ort_qrange(dtype, symmetric, reduce_range)
        kwargs.update(quant_min=int(qmin), quant_max=int(qmax))
        # Per-tensor weights are stored as per-channel vectors repeating one scale/zero point: the same
        # numbers, in the form inductor's x86 int8 conv/linear lowering matches (it needs per-channel ops).
        kwargs["qscheme"] = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
        super().__init__(dtype=dtype, **kwargs)
        self.symmetric = symmetric
        self.reduce_range = reduce_range
        self.per_channel = per_channel
        self.ch_axis = ch_axis
        self.min_val: torch.Tensor | None = None
        self.max_val: torch.Tensor | None = None

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        values = w.detach().float()
        channels = values.shape[self.ch_axis]
        if self.per_channel:
            values = values.transpose(0, self.ch_axis).flatten(1)
            self.min_val, self.max_val = values.amin(dim=1), values.amax(dim=1)
        else:
            self.min_val, self.max_val = values.min().expand(channels), values.max().expand(channels)
        return w

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.min_val is None or self.max_val is None:
            raise RuntimeError("The weight observer never saw its weight; run calibration first.")
        pairs = [
            ort_scale_zero_point(lo, hi, self.dtype, self.symmetric, self.reduce_range)
            for lo, hi in zip(self.min_val.tolist(), self.max_val.tolist(), strict=True)
        ]
        scales = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
        zero_points = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
        return scales, zero_points


class SharedObserver(UniformQuantizationObserverBase):
    """A second use of a shared observer (e.g. an average pool's output, which takes its input's
    parameters, like ORT's QDQDirect8BitOp): it passes values through and defers to the first use, so
    the shared range is calibrated on the first tensor only, as ORT calibrates it."""

    def __init__(self, primary: OrtActivationObserver) -> None:
        super().__init__(
            dtype=primary.dtype,
            qscheme=primary.qscheme,
            quant_min=primary.quant_min,
            quant_max=primary.quant_max,
        )
        self._primary = (primary,)  # a tuple, so the primary is not registered as a child module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._primary[0].calculate_qparams()


def split_shared_observers(prepared: fx.GraphModule) -> int:
    """Give every use of a shared activation observer but the first a :class:`SharedObserver`."""
    first_use: dict[int, str] = {}
    split = 0
    for node in prepared.graph.nodes:
        if node.op != "call_module":
            continue
        module = prepared.get_submodule(node.target)
        if not isinstance(module, OrtActivationObserver):
            continue
        if id(module) in first_use:
            setattr(prepared, node.target, SharedObserver(module))
            split += 1
        else:
            first_use[id(module)] = node.target
    return split


# ----------------------------------------------------------------------------------------- quantizer


def quantization_config(spec: QuantSpec) -> QuantizationConfig:
    """A QuantizationConfig for X86InductorQuantizer: ORT-style observers in the requested dtypes."""
    act_dtype, weight_dtype = _QDTYPES[spec.activation], _QDTYPES[spec.weight]
    qmin, qmax = _ort_qrange(act_dtype, symmetric=False)
    activation = QuantizationSpec(
        dtype=act_dtype,
        quant_min=int(qmin),
        quant_max=int(qmax),
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=OrtActivationObserver.with_args(calib=spec.calib),
    )
    symmetric = ort_weight_symmetric(weight_dtype, spec.per_channel)
    wmin, wmax = _ort_qrange(weight_dtype, symmetric, spec.reduce_range)
    # X86InductorQuantizer accepts only *symmetric* weight qschemes in the spec; the observer sets the
    # effective one (affine for per-tensor uint8, as ORT does), and convert_pt2e reads it from the observer.
    weight = QuantizationSpec(
        dtype=weight_dtype,
        quant_min=int(wmin),
        quant_max=int(wmax),
        qscheme=torch.per_channel_symmetric if spec.per_channel else torch.per_tensor_symmetric,
        ch_axis=0 if spec.per_channel else None,
        observer_or_fake_quant_ctr=OrtWeightObserver.with_args(
            per_channel=spec.per_channel, ch_axis=0, reduce_range=spec.reduce_range
        ),
    )
    return QuantizationConfig(activation, activation, weight, None, is_qat=False)


def _is_zero_pad(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target != torch.ops.aten.pad.default:
        return False
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", 0.0)
    return mode == "constant" and not value


class OrtAlignedX86Quantizer(X86InductorQuantizer):
    """X86InductorQuantizer, except that a zero pad feeding a quantized op is quantized with its input's
    parameters. onnx2torch splits ONNX's asymmetric Conv padding into pad + conv; ORT calibrates the
    Conv input (the unpadded tensor), so the torch range must come from the unpadded tensor too."""

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        super().annotate(model)
        for pad in [n for n in model.graph.nodes if _is_zero_pad(n)]:
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
                _X86InductorQuantizationAnnotation(input_qspec_map={source: qspec}, _annotated=True),
            )
            annotation.input_qspec_map[pad] = SharedQuantizationSpec((source, pad))


def make_quantizer(spec: QuantSpec) -> OrtAlignedX86Quantizer:
    """X86InductorQuantizer (conv/linear/add/relu fusion patterns) with the spec's config."""
    return OrtAlignedX86Quantizer().set_global(quantization_config(spec))


# --------------------------------------------------------------------------------------- calibration


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


def calibrate(prepared: fx.GraphModule, images: np.ndarray, calib: CalibSpec) -> None:
    """Run the calibration batches (``calibration.batches`` order) through the observed model."""
    from tqdm import tqdm

    total = math.ceil(len(images) / calib.batch_size)
    with torch.no_grad():
        for batch in tqdm(batches(images, calib.batch_size), total=total, desc="calibrate", unit="batch"):
            prepared(torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)))


def compute_ranges(observers: dict[str, OrtActivationObserver]) -> list[TensorRange]:
    """Each observer's calibrated range (entropy/percentile histograms are evaluated here)."""
    return [TensorRange(name, *obs.compute_range()) for name, obs in observers.items()]


# ------------------------------------------------------------------------------------- saved program


def drop_unused_attributes(gm: fx.GraphModule) -> int:
    """Delete parameters/buffers no node reads (convert_pt2e leaves the float weights behind, and
    torch.export would save them: the file would hold the FP32 model too). Returns the count deleted."""
    used = {node.target for node in gm.graph.nodes if node.op == "get_attr"}
    names = [n for n, _ in gm.named_parameters()] + [n for n, _ in gm.named_buffers()]
    dropped = 0
    for name in names:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner) if owner else gm, attr)
            dropped += 1
    return dropped


def _qdq_op(node: fx.Node) -> str | None:
    """``quantize_per_tensor``, ``dequantize_per_channel``, ... for a quantized_decomposed op, else None."""
    target = node.target
    if node.op == "call_function" and getattr(target, "namespace", None) == "quantized_decomposed":
        return target._opname
    return None


def qdq_counts(gm: fx.GraphModule) -> Counter[str]:
    """How many quantize/dequantize ops of each kind the graph holds."""
    return Counter(op for node in gm.graph.nodes if (op := _qdq_op(node)))


def _is_constant_input(program: torch.export.ExportedProgram, node: fx.Node) -> bool:
    """True for a placeholder that is a parameter/buffer/constant rather than the user input."""
    return node.op == "placeholder" and node.name not in program.graph_signature.user_inputs


def _dtype_arg(node: fx.Node) -> str:
    dtype = node.kwargs.get("dtype", node.args[-1])
    if not isinstance(dtype, torch.dtype):
        raise RuntimeError(f"{node.name}: no dtype argument in {node.args}.")
    return str(dtype).removeprefix("torch.")


def weight_dequantizes(program: torch.export.ExportedProgram) -> list[fx.Node]:
    """Dequantize ops whose input is a stored (folded) integer constant: the quantized weights."""
    return [
        node
        for node in program.graph.nodes
        if (op := _qdq_op(node)) and op.startswith("dequantize") and _is_constant_input(program, node.args[0])
    ]


def _stored_tensor(program: torch.export.ExportedProgram, node: fx.Node) -> torch.Tensor:
    """The parameter/buffer/constant a placeholder of the program stands for."""
    sig = program.graph_signature
    for mapping in (sig.inputs_to_parameters, sig.inputs_to_buffers):
        if node.name in mapping:
            return program.state_dict[mapping[node.name]]
    return program.constants[sig.inputs_to_lifted_tensor_constants[node.name]]


def quantized_weights(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """The stored integer weights of a quantized program (the inputs of its weight dequantize ops)."""
    return [_stored_tensor(program, node.args[0]) for node in weight_dequantizes(program)]


def weight_granularity(program: torch.export.ExportedProgram) -> str:
    """Whether some weight has distinct scales across channels ("per-channel") or none ("per-tensor")."""
    for node in weight_dequantizes(program):
        scale = node.args[1]
        if isinstance(scale, fx.Node) and _stored_tensor(program, scale).unique().numel() > 1:
            return "per-channel"
    return "per-tensor"


def effective_dtypes(program: torch.export.ExportedProgram) -> tuple[str, str]:
    """(activation, weight) dtypes read from the program's quantize/dequantize ops.

    Activations: the dtype of every runtime ``quantize_per_tensor``. Weights: the dtype of every
    dequantize whose input is a stored (folded) integer constant. Raises unless each is one dtype.
    """
    act = {_dtype_arg(n) for n in program.graph.nodes if _qdq_op(n) == "quantize_per_tensor"}
    weight = {_dtype_arg(n) for n in weight_dequantizes(program)}
    if len(act) != 1 or len(weight) != 1:
        raise RuntimeError(f"Expected one activation and one weight dtype, found {act} and {weight}.")
    return act.pop(), weight.pop()


def _payload_bytes(program: torch.export.ExportedProgram) -> int:
    """Bytes of the stored tensors (weights, scales, zero points, biases), without the file format."""
    tensors = [*program.state_dict.values(), *program.constants.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _check_quantized(program: torch.export.ExportedProgram) -> Counter[str]:
    """Fail unless the saved program really quantizes: q/dq ops on activations and on every weight."""
    counts = qdq_counts(program.graph_module)
    aten = torch.ops.aten
    n_weights = _count_targets(program.graph_module, aten.conv2d.default, aten.linear.default)
    n_weight_dq = len(weight_dequantizes(program))
    if counts["quantize_per_tensor"] == 0 or counts["dequantize_per_tensor"] == 0 or n_weight_dq < n_weights:
        raise RuntimeError(
            f"The converted model is not quantized: {dict(counts)}; {n_weight_dq}/{n_weights} weights "
            f"dequantized from integers."
        )
    return counts


# -------------------------------------------------------------------------------------------- native


class NativeUnavailable(RuntimeError):
    """Inductor did not turn the quantized model into integer kernels (after ``seconds`` of trying)."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


def _count_targets(gm: fx.GraphModule, *targets: Any) -> int:
    return sum(node.op == "call_function" and node.target in targets for node in gm.graph.nodes)


def compile_native(module: fx.GraphModule, input_shape: tuple[int, ...]) -> tuple[Predictor, float, str]:
    """torch.compile (inductor, freezing) the converted model for batches of PREDICT_BATCH images.

    Returns the predictor, the compile seconds and what was lowered. Raises NativeUnavailable unless inductor
    packed every conv and linear weight for a oneDNN int8 kernel (its pattern-matcher counters say so).
    """
    from torch._dynamo.utils import counters

    aten = torch.ops.aten
    expected = (_count_targets(module, aten.conv2d.default), _count_targets(module, aten.linear.default))
    torch._dynamo.reset()  # a fresh cache: no recompile limit reached across many quantize() calls
    counters.clear()
    start = time.perf_counter()
    compiled = torch.compile(module, dynamic=False)
    with torch._inductor.config.patch(freezing=True), torch.inference_mode():
        try:
            compiled(torch.zeros((PREDICT_BATCH, *input_shape)))
        except Exception as err:  # inductor raises many types when a kernel refuses a dtype
            message = f"inductor failed: {type(err).__name__}: {str(err)[:200]}"
            raise NativeUnavailable(message, time.perf_counter() - start) from err
    seconds = time.perf_counter() - start
    packed = (
        counters["inductor"]["qconv_weight_prepack_matcher_count"],
        counters["inductor"]["qlinear_weight_prepack_matcher_count"],
    )
    if packed != expected:
        raise NativeUnavailable(
            f"inductor lowered {packed[0]}/{expected[0]} conv and {packed[1]}/{expected[1]} linear ops to "
            f"int8 kernels",
            seconds,
        )
    with torch._inductor.config.patch(freezing=True), torch.inference_mode():
        compiled(torch.zeros((1, *input_shape)))  # a second specialisation, for single-image latency
    lowered = f"{packed[0]}/{expected[0]} conv and {packed[1]}/{expected[1]} linear layers"
    return _padded_predictor(compiled, input_shape), time.perf_counter() - start, lowered


def _padded_predictor(compiled: Any, input_shape: tuple[int, ...]) -> Predictor:
    """Feed the compiled model single images or fixed PREDICT_BATCH batches (zero-padded), the two shapes
    it was compiled for, so it never recompiles."""

    def predict(images: np.ndarray) -> np.ndarray:
        images = np.asarray(images, dtype=np.float32)
        outputs = []
        with torch._inductor.config.patch(freezing=True), torch.inference_mode():
            if len(images) == 1:
                return compiled(torch.from_numpy(images)).numpy()
            for start in range(0, len(images), PREDICT_BATCH):
                chunk = images[start : start + PREDICT_BATCH]
                batch = torch.zeros((PREDICT_BATCH, *input_shape))
                batch[: len(chunk)] = torch.from_numpy(chunk)
                outputs.append(compiled(batch)[: len(chunk)].numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 10), np.float32)

    return predict


# -------------------------------------------------------------------------------------- layer errors

LAYER_ERROR_BATCH = 100
"""Images per forward pass when recording intermediate tensors for :meth:`TorchBackend.layer_errors`."""
LAYER_ERROR_THREADS = 1
"""Intra-op threads while recording: the eager q/dq ops on small tensors gain little from more, and on a
busy machine (parallel sweep workers) two threads were measured 10-25x slower than one."""

Pairs = dict[str, tuple[str, str]]
"""Layer name -> (node of the FP32 graph, node of the quantized graph) whose outputs are compared."""

_WEIGHTED_OPS = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)
_LAYOUT_OPS = (torch.ops.aten.permute.default, torch.ops.aten.reshape.default, torch.ops.aten.view.default)


def sqnr_db(signal_sq: float, noise_sq: float) -> float:
    """ORT's ``compute_signal_to_quantization_noice_ratio`` from sums of squares accumulated batch by batch
    (memory stays flat): 20·log10(‖x‖ / ‖x - y‖), each norm floored at float64 eps, so identical tensors
    give a large finite value (~300 dB and up) rather than infinity."""
    eps = float(np.finfo(float).eps)
    return 20 * math.log10(max(math.sqrt(signal_sq), eps) / max(math.sqrt(noise_sq), eps))


class _Recorder(fx.Interpreter):
    """Runs a GraphModule node by node and keeps the outputs of the named nodes."""

    def __init__(self, module: fx.GraphModule, nodes: set[str]) -> None:
        super().__init__(module)
        self.nodes = nodes
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.name in self.nodes:
            self.values[n.name] = value
        return value


@contextlib.contextmanager
def _intra_op_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` torch intra-op threads, then restore the previous setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def record(
    module: fx.GraphModule, nodes: Iterable[str], images: np.ndarray, batch_size: int = LAYER_ERROR_BATCH
) -> Iterator[dict[str, torch.Tensor]]:
    """Run ``module`` on NHWC ``images`` batch by batch; yield each batch's outputs of the named nodes."""
    recorder = _Recorder(module, set(nodes))
    missing = recorder.nodes - {node.name for node in module.graph.nodes}
    if missing:
        raise ValueError(f"Nodes {sorted(missing)} are not in the graph.")
    for batch in batches(images, batch_size):
        recorder.values = {}
        with torch.inference_mode():
            recorder.run(torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)))
        yield recorder.values


def _pair_values(
    layer: str, ref: str, node: str, ref_values: dict[str, torch.Tensor], values: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recorded FP32 and quantized tensors of one pair, which must have the same shape."""
    x, y = ref_values[ref], values[node]
    if x.shape != y.shape:
        raise RuntimeError(
            f"{layer}: FP32 {ref} has shape {tuple(x.shape)}, quantized {node} {tuple(y.shape)}; the graphs "
            f"are matched wrongly."
        )
    return x, y


def compare(
    reference: fx.GraphModule,
    measured: fx.GraphModule,
    activations: Pairs,
    weights: Pairs,
    images: np.ndarray,
    batch_size: int = LAYER_ERROR_BATCH,
) -> tuple[dict[str, float], dict[str, float]]:
    """SQNR (dB) of each activation and each weight pair: the measured node's output against the
    reference node's, keyed like the pairs.

    Activations are summed over all ``images``; weights do not depend on the input and are compared once
    (with ORT's function itself). Raises if a pair's shapes differ: then the graphs were matched wrongly.
    """
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio as ort_sqnr

    if len(images) == 0:
        raise ValueError("No images to measure layer errors on.")
    sums = dict.fromkeys(activations, (0.0, 0.0))
    weight_sqnr: dict[str, float] = {}
    nodes = [*activations.values(), *weights.values()]
    runs = zip(
        record(reference, {ref for ref, _ in nodes}, images, batch_size),
        record(measured, {node for _, node in nodes}, images, batch_size),
        strict=True,
    )
    with _intra_op_threads(LAYER_ERROR_THREADS), torch.inference_mode():
        for ref_values, values in runs:
            for layer, (ref, node) in activations.items():
                x, y = _pair_values(layer, ref, node, ref_values, values)
                signal, noise = sums[layer]
                sums[layer] = (
                    signal + float(x.double().square().sum()),
                    noise + float((x - y).double().square().sum()),
                )
            for layer, (ref, node) in weights.items():
                if layer not in weight_sqnr:
                    x, y = _pair_values(layer, ref, node, ref_values, values)
                    weight_sqnr[layer] = ort_sqnr(x.numpy(), y.numpy())
    return {layer: sqnr_db(*sums[layer]) for layer in activations}, weight_sqnr


def _graph_signature(graph: fx.Graph) -> list[tuple[str, str, str]]:
    return [(node.name, node.op, str(node.target)) for node in graph.nodes]


def onnx_nodes(program: torch.export.ExportedProgram, onnx_path: Path) -> dict[str, Any]:
    """The ONNX node (``onnx.NodeProto``) each node of the saved FP32 program comes from, by node name.

    The saved program has no module metadata (``_save`` strips it), so the ONNX model is converted and
    exported again, which reproduces the same graph with it. If the graphs differ: an empty dict (layers
    are then named by their aten nodes).
    """
    import onnx

    by_name = {node.name: node for node in onnx.load(str(onnx_path), load_external_data=False).graph.node}
    traced = export(onnx_to_torch(onnx_path), _example(_input_shape(onnx_path)))
    if _graph_signature(traced.graph) != _graph_signature(program.graph):
        log.warning("%s no longer exports to the saved FP32 graph; layers get aten node names", onnx_path)
        return {}
    found = {}
    for node in traced.graph.nodes:
        # The outermost module below the root is the onnx2torch module of one ONNX node.
        stack = node.meta.get("nn_module_stack") or {}
        top = next((path for path, _ in stack.values() if path), None)
        if top in by_name:
            found[node.name] = by_name[top]
    return found


def _is_model_input(node: fx.Node) -> bool:
    """The user input, or a layout change of it (the NHWC -> NCHW permute)."""
    while node.op == "call_function" and node.target in _LAYOUT_OPS:
        node = node.args[0]
    return node.op == "placeholder"


def layer_pairs(
    reference: fx.GraphModule, measured: fx.GraphModule, names: dict[str, Any]
) -> tuple[Pairs, Pairs]:
    """(activations, weights) to compare between the FP32 (``reference``) and the quantized graph.

    Nodes are matched by name, checked by op: both programs are exported from the same onnx2torch module,
    and quantization keeps the compute ops' names. Activations: each tensor the quantized graph quantizes,
    taken where it is dequantized for the next op (ORT's qdq_loss_debug compares the same two tensors).
    Left out: the model input (integer pixels, quantized losslessly) and zero pads (they carry their
    input's quantization, so their error is their input's). Weights: each conv/linear weight, float vs
    dequantized. ``names`` (from :func:`onnx_nodes`) gives layers their ONNX names.
    """
    from resnet8ptq.backends.onnx import layer_name  # one naming for both backends

    ref_nodes = {node.name: node for node in reference.graph.nodes}

    def counterpart(node: fx.Node) -> fx.Node:
        ref = ref_nodes.get(node.name)
        if ref is None or ref.target != node.target:
            raise RuntimeError(f"The quantized graph's {node.name} ({node.target}) is not in the FP32 graph.")
        return ref

    activations: Pairs = {}
    for quantize in measured.graph.nodes:
        source = quantize.args[0] if _qdq_op(quantize) == "quantize_per_tensor" else None
        if source is None or _is_zero_pad(source) or _is_model_input(source):
            continue
        dequantize = next(user for user in quantize.users if _qdq_op(user) == "dequantize_per_tensor")
        name = layer_name(names[source.name].output[0]) if source.name in names else source.name
        if name in activations:
            raise RuntimeError(f"Two quantized tensors are both named {name!r}.")
        activations[name] = (counterpart(source).name, dequantize.name)

    weights: Pairs = {}
    for node in measured.graph.nodes:
        if node.op != "call_function" or node.target not in _WEIGHTED_OPS:
            continue
        weight = node.args[1]
        if not (_qdq_op(weight) or "").startswith("dequantize"):
            raise RuntimeError(f"{node.name}: the weight is not dequantized from integers ({weight.name}).")
        name = layer_name(names[node.name].input[1]) if node.name in names else node.name
        weights[name] = (counterpart(node).args[1].name, weight.name)
    if len(weights) != _count_targets(reference, *_WEIGHTED_OPS):
        raise RuntimeError(
            f"Matched {len(weights)} of the FP32 graph's {_count_targets(reference, *_WEIGHTED_OPS)} "
            f"conv/linear weights."
        )
    return activations, weights


# ----------------------------------------------------------------------------------------- backend


def _input_shape(onnx_path: Path) -> tuple[int, ...]:
    """The model input's per-image shape (32, 32, 3), read from the ONNX graph."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    dims = graph.input[0].type.tensor_type.shape.dim[1:]
    return tuple(int(d.dim_value) for d in dims)


def _example(input_shape: tuple[int, ...]) -> tuple[torch.Tensor]:
    """A small self-contained example input for torch.export (never a view of a large tensor)."""
    return (torch.zeros((EXAMPLE_BATCH, *input_shape)),)


_DEBUG_META = ("stack_trace", "from_node", "nn_module_stack", "source_fn_stack", "torch_fn", "custom")


def _save(program: torch.export.ExportedProgram, path: Path) -> torch.export.ExportedProgram:
    """Save a program and load it back: what callers run and inspect is exactly the file.

    The sample inputs and the per-node debug metadata (stack traces, provenance) are left out, for the
    FP32 and the quantized model alike, so the file size is the program and its weights.
    """
    program.example_inputs = None
    for node in program.graph.nodes:
        for key in _DEBUG_META:
            node.meta.pop(key, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return load_program(path)


class TorchBackend(Backend):
    """onnx2torch + torchao PT2E (X86InductorQuantizer, ORT-equivalent observers), torch.export files.

    ``native=True`` (default) compiles uint8-activation/int8-weight models into inductor's x86 int8
    kernels as their runtime form; ``native=False`` runs only the reference (eager quantize/dequantize)
    program and skips the compile.
    """

    NAME = "torch"

    def __init__(self, native: bool = True, threads: int | None = None) -> None:
        super().__init__(native, threads)
        if threads:
            torch.set_num_threads(threads)

    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        """onnx2torch conversion, exported and saved as ``model_fp32.pt2``."""
        module = onnx_to_torch(onnx_path)
        program = _save(export(module, _example(_input_shape(onnx_path))), Path(workdir) / "model_fp32.pt2")
        return Model(predict=make_predictor(program.module()), path=Path(workdir) / "model_fp32.pt2")

    def quantize(
        self, onnx_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        """PT2E static quantization of a fresh conversion of ``onnx_path`` (prepare_pt2e rewrites the graph it
        is given); saves ``model_quantized.pt2``; compiles the runtime form where x86 int8 kernels exist."""
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        start = time.perf_counter()
        input_shape = _input_shape(onnx_path)
        example = _example(input_shape)
        prepared = prepare_pt2e(export(onnx_to_torch(onnx_path), example).module(), make_quantizer(spec))
        split_shared_observers(prepared)
        observers = activation_observers(prepared, onnx_path)
        calib_start = time.perf_counter()
        calibrate(prepared, calibration_images, spec.calib)
        ranges = compute_ranges(observers)
        calib_seconds = time.perf_counter() - calib_start
        converted = convert_pt2e(prepared)
        drop_unused_attributes(converted)
        path = Path(workdir) / "model_quantized.pt2"
        program = _save(export(converted, example), path)
        counts = _check_quantized(program)
        activation_dtype, weight_dtype = effective_dtypes(program)
        quantize_seconds = time.perf_counter() - start - calib_seconds  # as in ORT: calibration apart

        reference = make_predictor(program.module())
        runtime, compile_seconds = self._runtime(
            program, input_shape, (activation_dtype, weight_dtype), reference
        )
        log.info("torch %s/%s runtime: %s", activation_dtype, weight_dtype, runtime.kernels)
        return QuantizedModel(
            path=path,
            reference=reference,
            runtime=runtime,
            activation_dtype=activation_dtype,
            weight_dtype=weight_dtype,
            ranges=ranges,
            calib_seconds=calib_seconds,
            quantize_seconds=quantize_seconds,
            metrics={
                "compile_seconds": compile_seconds,
                **{f"{op}_ops": float(n) for op, n in counts.items()},
                "weights_bytes": float(_payload_bytes(program)),
            },
            tags={
                "weight_granularity": weight_granularity(program),
                "quantizer": "torchao.pt2e.X86InductorQuantizer+ORT-observers",
            },
        )

    def _runtime(
        self,
        program: torch.export.ExportedProgram,
        input_shape: tuple[int, ...],
        dtypes: tuple[str, str],
        reference: Predictor,
    ) -> tuple[Runtime, float]:
        """The compiled int8-kernel model where inductor has kernels for it, else the reference program;
        and the compile seconds."""
        if not self.native:
            return Runtime(reference, False, "native execution disabled (backend.native=false)"), 0.0
        if dtypes != ("uint8", "int8"):
            reason = (
                f"x86 integer kernels (oneDNN via inductor) need uint8 activations and int8 weights, not "
                f"{dtypes[0]}/{dtypes[1]}: the PT2E quantize/dequantize program runs in float"
            )
            return Runtime(reference, False, reason), 0.0
        try:
            compiled, seconds, lowered = compile_native(program.module(), input_shape)
        except NativeUnavailable as err:
            return Runtime(
                reference, False, f"no integer kernels ({err}): the q/dq program runs"
            ), err.seconds
        return Runtime(compiled, True, f"inductor lowered {lowered} to oneDNN int8 kernels"), seconds

    def layer_errors(
        self, fp32: Model, quantized: QuantizedModel, onnx_path: Path, images: np.ndarray, workdir: Path
    ) -> list[LayerError]:
        """SQNR of the saved quantized program (its q/dq form, also for native runs) against the saved FP32
        program: each quantized activation where it is dequantized, and each conv/linear weight.
        Nothing is written to ``workdir``."""
        start = time.perf_counter()
        reference = load_program(fp32.path)
        fp32_module, quantized_module = reference.module(), load_program(quantized.path).module()
        activations, weights = layer_pairs(fp32_module, quantized_module, onnx_nodes(reference, onnx_path))
        activation_sqnr, weight_sqnr = compare(fp32_module, quantized_module, activations, weights, images)
        log.info("torch layer errors on %d images in %.1f s", len(images), time.perf_counter() - start)
        return [LayerError(layer, "weight", sqnr) for layer, sqnr in weight_sqnr.items()] + [
            LayerError(layer, "activation", sqnr) for layer, sqnr in activation_sqnr.items()
        ]

    def versions(self) -> dict[str, str]:
        """torch, torchao, onnx2torch and torchvision versions."""
        import importlib.metadata

        return {
            name: importlib.metadata.version(name)
            for name in ("torch", "torchao", "onnx2torch", "torchvision")
        }
