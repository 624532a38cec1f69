"""The FP32 ONNX model run in torch (onnx2torch: one module per ONNX node) with the activations ONNX
Runtime's QDQ recipe stores quantized in the loop, as the backends will quantize them: what block
reconstruction (:mod:`resnet8ptq.algorithms._reconstruction`) learns on and what the budgeted mixed-precision
search (:mod:`resnet8ptq.search.budget`) measures each layer's sensitivity with."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import fx

from resnet8ptq.dtype import ort_scale_zero_point

if TYPE_CHECKING:
    import onnx

CHUNK = 250  # images per forward pass when a block's outputs are computed without gradients


@dataclass(frozen=True)
class Block:
    """Consecutive nodes of the converted graph: the node whose value it reads, its nodes (the last one's
    value is its output) and the conv/gemm ONNX nodes among them."""

    source: fx.Node
    nodes: tuple[fx.Node, ...]
    layers: tuple[str, ...]


class LearnedStep(torch.nn.Module):
    """An activation quantizer whose step is learned (LSQ) and whose zero point is fixed: ORT's scale and
    zero point of the calibrated ``(low, high)`` on ``qrange``, the scale then multiplied by the learned
    ``ratio``. ``drop_prob``: QDrop's chance of passing an element through unquantized while learning."""

    def __init__(self, low: float, high: float, qrange: tuple[int, int]) -> None:
        super().__init__()
        self.qmin, self.qmax = qrange
        scale, self.zero_point = ort_scale_zero_point(low, high, self.qmin, self.qmax, symmetric=False)
        self.register_buffer("initial", torch.tensor(scale, dtype=torch.float32))
        self.ratio = torch.nn.Parameter(torch.tensor(1.0))
        self.frozen: torch.Tensor | None = None
        self.drop_prob = 0.0

    def scale(self) -> torch.Tensor:
        return self.frozen if self.frozen is not None else self.initial * self.ratio

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale()
        scaled = x / scale
        rounded = scaled + (torch.round(scaled) - scaled).detach()  # round, with a straight-through gradient
        out = (torch.clamp(rounded + self.zero_point, self.qmin, self.qmax) - self.zero_point) * scale
        if self.drop_prob > 0:
            out = torch.where(torch.rand_like(x) < self.drop_prob, x, out)
        return out

    def freeze(self) -> None:
        """Fix the step at the scale the backends will compute from :meth:`learned_range`."""
        if self.frozen is not None:
            return
        scale, zero_point = ort_scale_zero_point(*self._range(), self.qmin, self.qmax, symmetric=False)
        if zero_point != self.zero_point:
            raise RuntimeError(
                f"A learned step's range gives zero point {zero_point}, not {self.zero_point}."
            )
        self.frozen = torch.tensor(scale, dtype=torch.float32)
        self.ratio.requires_grad_(False)

    def learned_range(self) -> tuple[float, float]:
        """The (min, max) from which ORT's formula gives the learned scale and zero point (float32 values)."""
        self.freeze()
        return self._range()

    def _range(self) -> tuple[float, float]:
        scale = float(self.scale().detach())
        low = np.float32((self.qmin - self.zero_point) * scale)
        high = np.float32((self.qmax - self.zero_point) * scale)
        return float(low), float(high)


class Simulation:
    """The FP32 ONNX model in torch (onnx2torch), run block by block; with ``quantizers``, every stored
    activation is quantized by its source's :class:`LearnedStep` (``stored``: tensor -> source tensor)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        stored: dict[str, str],
        quantizers: dict[str, LearnedStep] | None = None,
    ) -> None:
        from resnet8ptq.backends.torch.convert import onnx_to_torch

        self.gm = onnx_to_torch(model)
        self.tensors = {node.name: node.output[0] for node in model.graph.node}  # module -> ONNX tensor
        self.stored = stored
        self.quantizers = quantizers

    def run(self, block: Block, inputs: torch.Tensor) -> torch.Tensor:
        """The block's output for ``inputs`` (the value of its source)."""
        from resnet8ptq.backends.torch.convert import get_attr

        env: dict[str, Any] = {block.source.name: inputs}

        def value(node: fx.Node) -> Any:
            if node.op == "get_attr":
                return get_attr(self.gm, node.target)
            return env[node.name]

        for node in block.nodes:
            module = self.gm.get_submodule(node.target)
            out = module(*fx.node.map_arg(node.args, value), **fx.node.map_arg(node.kwargs, value))
            tensor = self.tensors.get(node.target)
            if self.quantizers is not None and tensor in self.stored:
                out = self.quantizers[self.stored[tensor]](out)
            env[node.name] = out
        return env[block.nodes[-1].name]

    def run_all(self, block: Block, inputs: torch.Tensor) -> torch.Tensor:
        """:meth:`run` over every input, chunk by chunk, without gradients."""
        with torch.no_grad():
            return torch.cat([self.run(block, inputs[i : i + CHUNK]) for i in range(0, len(inputs), CHUNK)])

    def block_tensors(self, block: Block) -> list[str]:
        """The stored activations the block computes, by their source tensor."""
        found = [self.tensors.get(node.target) for node in block.nodes]
        return [self.stored[tensor] for tensor in found if tensor in self.stored]

    def values(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every ONNX tensor's value on ``images`` (float: the quantizers are not applied)."""
        recorded: dict[str, torch.Tensor] = {}
        tensors = self.tensors

        class Recorder(fx.Interpreter):
            def run_node(self, node: fx.Node) -> Any:
                out = super().run_node(node)
                if node.op == "call_module" and node.target in tensors:
                    recorded[tensors[node.target]] = out
                return out

        with torch.no_grad():
            Recorder(self.gm).run(images)
        return recorded


def stored_activations(model: onnx.ModelProto) -> dict[str, str]:
    """The activations ONNX Runtime's QDQ recipe stores quantized (asked of ORT: ``quantize_static`` on the
    FP32 model, read back from its QuantizeLinear nodes), each mapped to the tensor whose quantization it
    takes: itself, or the start of a pool/reshape chain (:func:`resnet8ptq.layers.sharing`). The graph's
    output (the softmax's probabilities) is left out."""
    import onnx
    from onnxruntime.quantization import QuantFormat, quantize_static

    from resnet8ptq.backends.onnx.backend import OP_TYPES
    from resnet8ptq.backends.onnx.reader import ImageReader
    from resnet8ptq.backends.onnx.widths import QUANTIZE_INPUT_SUFFIX
    from resnet8ptq.layers import sharing
    from resnet8ptq.model import layer_name

    graph_input = model.graph.input[0]
    shape = [dim.dim_value or 1 for dim in graph_input.type.tensor_type.shape.dim]
    with tempfile.TemporaryDirectory() as workdir:
        source, out = Path(workdir) / "fp32.onnx", Path(workdir) / "qdq.onnx"
        onnx.save(model, source)
        reader = ImageReader(np.full(shape, 128.0, np.float32), 1, graph_input.name, "ORT recipe probe")
        quantize_static(source, out, reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=OP_TYPES)
        quantized = onnx.load(out)
    names = {
        node.input[0].removesuffix(QUANTIZE_INPUT_SUFFIX)
        for node in quantized.graph.node
        if node.op_type == "QuantizeLinear"
    }
    produced = {layer_name(tensor): tensor for node in model.graph.node for tensor in node.output}
    outputs = {output.name for output in model.graph.output}
    shares = sharing(model)
    stored = {}
    for name in sorted(names & set(produced.values()) - outputs):
        origin = shares.get(layer_name(name))
        stored[name] = produced.get(origin, name)
    return stored


def weighted_module(module: torch.nn.Module) -> torch.nn.Module | None:
    """The conv/linear module that runs a node (onnx2torch may wrap it, e.g. pad + conv), if any."""
    return next((m for m in module.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)), None)


def logits_block(simulation: Simulation, model: onnx.ModelProto) -> Block:
    """The whole model as one block, from its input to the last conv/gemm's output (the logits)."""
    from resnet8ptq.weight_grid import quantized_weights

    last = [node.name for node, _ in quantized_weights(model).values()][-1]
    nodes = [node for node in simulation.gm.graph.nodes if node.op not in ("get_attr", "output")]
    end = next(i for i, node in enumerate(nodes) if node.op == "call_module" and node.target == last)
    return Block(nodes[0], tuple(nodes[1 : end + 1]), ())
