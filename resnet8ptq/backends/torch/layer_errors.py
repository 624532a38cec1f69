"""Per-layer SQNR of a quantized program against the FP32 program: an FX interpreter records the same points
ORT's qdq_loss_debug compares (each quantized activation where it is dequantized, each conv/linear weight)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx

from resnet8ptq import layer_errors
from resnet8ptq.backends.torch.convert import (
    example_input,
    export,
    input_shape,
    load_program,
    onnx_module,
    onnx_to_torch,
)
from resnet8ptq.backends.torch.program import WEIGHTED_OPS, count_targets, is_zero_pad, qdq_op
from resnet8ptq.calibration import batches
from resnet8ptq.hardware import torch_threads
from resnet8ptq.layer_errors import Pair
from resnet8ptq.model import layer_name

log = logging.getLogger(__name__)


LAYER_ERROR_BATCH = 100
"""Images per forward pass when recording intermediate tensors for :meth:`TorchBackend.layer_errors`."""


LAYER_ERROR_THREADS = 1
"""Intra-op threads while recording: the eager q/dq ops on small tensors gain little from more, and on a
busy machine (parallel sweep workers) two threads were measured 10-25x slower than one."""


Pairs = dict[str, tuple[str, str]]
"""Layer name -> (node of the FP32 graph, node of the quantized graph) whose outputs are compared."""


_LAYOUT_OPS = (torch.ops.aten.permute.default, torch.ops.aten.reshape.default, torch.ops.aten.view.default)


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


class ProgramPairs:
    """The tensor pairs of a quantized program and the FP32 program
    (:class:`resnet8ptq.layer_errors.TensorPairs`): the outputs of the paired nodes (:func:`layer_pairs`),
    recorded batch by batch on one thread; the weights (constants) from the first batch's recording."""

    def __init__(
        self,
        reference: fx.GraphModule,
        measured: fx.GraphModule,
        activations: Pairs,
        weights: Pairs,
        batch_size: int = LAYER_ERROR_BATCH,
    ) -> None:
        self.modules, self.pairs, self.weight_pairs = (reference, measured), activations, weights
        self.batch_size = batch_size
        self.recorded_weights: dict[str, Pair] = {}

    def activations(self, images: np.ndarray) -> Iterator[dict[str, Pair]]:
        nodes = [*self.pairs.values(), *self.weight_pairs.values()]
        runs = zip(
            record(self.modules[0], {ref for ref, _ in nodes}, images, self.batch_size),
            record(self.modules[1], {node for _, node in nodes}, images, self.batch_size),
            strict=True,
        )
        with torch_threads(LAYER_ERROR_THREADS), torch.inference_mode():
            for ref_values, values in runs:
                if not self.recorded_weights:
                    self.recorded_weights = _paired(self.weight_pairs, ref_values, values)
                yield _paired(self.pairs, ref_values, values)

    def weights(self) -> dict[str, Pair]:
        return self.recorded_weights


def _paired(
    pairs: Pairs, ref_values: dict[str, torch.Tensor], values: dict[str, torch.Tensor]
) -> dict[str, Pair]:
    """The recorded (FP32, quantized) tensors of each pair, as arrays."""
    return {layer: (ref_values[ref].numpy(), values[node].numpy()) for layer, (ref, node) in pairs.items()}


def compare(
    reference: fx.GraphModule,
    measured: fx.GraphModule,
    activations: Pairs,
    weights: Pairs,
    images: np.ndarray,
    batch_size: int = LAYER_ERROR_BATCH,
) -> tuple[dict[str, float], dict[str, float]]:
    """SQNR (dB) of each activation pair (summed over all ``images``) and each weight pair, keyed like the
    pairs (:func:`resnet8ptq.layer_errors.measure` over :class:`ProgramPairs`). Raises if a pair's shapes
    differ: then the graphs were matched wrongly."""
    errors = layer_errors.measure(ProgramPairs(reference, measured, activations, weights, batch_size), images)
    by_kind = {
        kind: {e.layer: e.sqnr_db for e in errors if e.kind == kind} for kind in ("activation", "weight")
    }
    return by_kind["activation"], by_kind["weight"]


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
    traced = export(onnx_to_torch(onnx_path), example_input(input_shape(onnx_path)))
    if _graph_signature(traced.graph) != _graph_signature(program.graph):
        log.warning("%s no longer exports to the saved FP32 graph; layers get aten node names", onnx_path)
        return {}
    found = {}
    for node in traced.graph.nodes:
        top = onnx_module(node)
        if top in by_name:
            found[node.name] = by_name[top]
    return found


@functools.lru_cache(maxsize=2)
def fp32_side(
    fp32_path: Path, stamp: tuple[int, int], onnx_path: Path
) -> tuple[fx.GraphModule, dict[str, Any]]:
    """The saved FP32 program's module and the ONNX node of each of its nodes (:func:`onnx_nodes`), kept for
    the process's next run: the runs of a sweep compare against the same file (``stamp``: its size and
    modification time, so a rewritten file is read again). Only read, never modified, by :func:`compare`."""
    reference = load_program(fp32_path)
    return reference.module(), onnx_nodes(reference, onnx_path)


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
    ref_nodes = {node.name: node for node in reference.graph.nodes}

    def counterpart(node: fx.Node) -> fx.Node:
        ref = ref_nodes.get(node.name)
        if ref is None or ref.target != node.target:
            raise RuntimeError(f"The quantized graph's {node.name} ({node.target}) is not in the FP32 graph.")
        return ref

    activations: Pairs = {}
    for quantize in measured.graph.nodes:
        source = quantize.args[0] if qdq_op(quantize) == "quantize_per_tensor" else None
        if source is None or is_zero_pad(source) or _is_model_input(source):
            continue
        dequantize = next(user for user in quantize.users if qdq_op(user) == "dequantize_per_tensor")
        name = layer_name(names[source.name].output[0]) if source.name in names else source.name
        if name in activations:
            raise RuntimeError(f"Two quantized tensors are both named {name!r}.")
        activations[name] = (counterpart(source).name, dequantize.name)

    weights: Pairs = {}
    for node in measured.graph.nodes:
        if node.op != "call_function" or node.target not in WEIGHTED_OPS:
            continue
        weight = node.args[1]
        if not (qdq_op(weight) or "").startswith("dequantize"):
            raise RuntimeError(f"{node.name}: the weight is not dequantized from integers ({weight.name}).")
        name = layer_name(names[node.name].input[1]) if node.name in names else node.name
        weights[name] = (counterpart(node).args[1].name, weight.name)
    if len(weights) != count_targets(reference, *WEIGHTED_OPS):
        raise RuntimeError(
            f"Matched {len(weights)} of the FP32 graph's {count_targets(reference, *WEIGHTED_OPS)} "
            f"conv/linear weights."
        )
    return activations, weights


def program_pairs(fp32_path: Path, quantized_path: Path, onnx_path: Path) -> ProgramPairs:
    """The pairs of the saved quantized program against the saved FP32 program (:func:`layer_pairs`), layers
    named after ``onnx_path``."""
    stat = fp32_path.stat()
    fp32_module, names = fp32_side(fp32_path, (stat.st_size, stat.st_mtime_ns), onnx_path)
    quantized_module = load_program(quantized_path).module()
    return ProgramPairs(fp32_module, quantized_module, *layer_pairs(fp32_module, quantized_module, names))
