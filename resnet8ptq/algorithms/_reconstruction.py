"""Block reconstruction (BRECQ: Li et al., ICLR 2021, arXiv:2102.05426; QDrop: Wei et al., ICLR 2022,
arXiv:2203.05740), shared by the ``brecq`` and ``qdrop`` algorithms.

The FP32 ONNX model is run in torch (onnx2torch: one module per ONNX node) with every activation the ONNX
Runtime recipe stores quantized in the loop, and cut into **blocks**: runs of nodes between two single
tensors the graph passes on, each ending at a stored activation and holding at least one conv/gemm (in
ResNet8: the stem conv, the three residual blocks, the pooled dense head). Block by block, in order, on the
calibration sample:

- every conv/gemm weight of the block learns its rounding (AdaRound's soft rounding and regulariser,
  :mod:`._rounding`) on the grid the backends will use;
- every activation quantizer of the block learns its step (LSQ, Esser et al. 2020: the straight-through
  gradient of round, through the scale), its zero point kept from the calibrated range;
- the loss is the squared error of the block's output against the FP32 model's (BRECQ's plain
  reconstruction loss; its Fisher-weighted variant is not implemented) plus the rounding regulariser;
- the block reads the quantized model's input (the blocks before it already learned); QDrop instead mixes,
  element by element, that input with the FP32 model's and, inside the block, each quantized activation with
  its float value, with probability ``drop_prob`` each (the paper's setting).

The result reaches the backends as weights exactly on their grids (as AdaRound) plus each learned step as
the activation's range (:attr:`~resnet8ptq.algorithms.base.Context.ranges`), chosen so that ONNX Runtime's
scale/zero-point formula, which both backends use, gives back exactly the learned scale and zero point.
Activations the backend's recipe stores and the simulation does not (the PyTorch recipe's average-pool
output, which ORT gives its input's quantization) get the range of the tensor they follow.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx

from resnet8ptq.algorithms._rounding import REGULARIZATION, SoftRounding, regularization
from resnet8ptq.dtype import ort_scale_zero_point
from resnet8ptq.weight_grid import WeightGrid

if TYPE_CHECKING:
    import onnx

    from resnet8ptq.algorithms.base import Context
    from resnet8ptq.spec import QuantSpec

ROUNDING_LR = 1e-2  # Adam on AdaRound's v, as `adaround`
STEP_LR = 1e-3  # Adam on each activation step's ratio to its calibrated value, annealed to 0 (cosine)
CHUNK = 250  # images per forward pass when the blocks' inputs and targets are computed
LEARNING_THREADS = 1  # torch threads while learning: the learned model must not depend on `threads`


@dataclass(frozen=True)
class Block:
    """Consecutive nodes of the converted graph: the node whose value it reads, its nodes (the last one's
    value is its output) and the conv/gemm ONNX nodes among them."""

    source: fx.Node
    nodes: tuple[fx.Node, ...]
    layers: tuple[str, ...]


@dataclass(frozen=True)
class Rounded:
    """One conv/gemm weight being rounded: its soft rounding, its grid, its FP32 values, its initializer."""

    rounding: SoftRounding
    grid: WeightGrid
    weight: np.ndarray
    initializer: str


@dataclass
class Reconstruction:
    """What a reconstruction learned: per conv/gemm layer the share of weights rounded away from nearest,
    the blocks, and the learned activation ranges by ONNX tensor."""

    flipped: dict[str, float] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)


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


class RoundedWeight(torch.nn.Module):
    """A parametrization: the module's weight is its soft rounding's (transposed for a ``Linear`` whose ONNX
    ``Gemm`` holds it as inputs x outputs)."""

    def __init__(self, rounding: SoftRounding, transpose: bool) -> None:
        super().__init__()
        self.rounding, self.transpose = rounding, transpose

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        weight = self.rounding()
        return weight.T if self.transpose else weight


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


def reconstruct(
    model: onnx.ModelProto, context: Context, iterations: int, batch: int, drop_prob: float = 0.0
) -> Reconstruction:
    """Learn the weights' rounding and the activations' steps block by block; write the weights back onto
    their grids in ``model`` (in place); return what was learned. Runs torch on one thread (then restores
    the count): over 2000 iterations per block, 1 and 2 threads learned different models (the gradients'
    sums run in another order), and `threads` is not part of a run's identity."""
    threads = torch.get_num_threads()
    torch.set_num_threads(LEARNING_THREADS)
    try:
        return _reconstruct(model, context, iterations, batch, drop_prob)
    finally:
        torch.set_num_threads(threads)


def _reconstruct(
    model: onnx.ModelProto, context: Context, iterations: int, batch: int, drop_prob: float
) -> Reconstruction:
    from tqdm import tqdm

    from resnet8ptq.algorithms._graph import set_initializer

    torch.manual_seed(context.seed)
    stored = stored_activations(model)
    reference = Simulation(model, stored)
    simulated = Simulation(model, stored, activation_quantizers(reference, model, context))
    roundings = weight_roundings(simulated, model, context.spec)
    blocks = find_blocks(simulated)
    quantized_input = float_input = torch.from_numpy(np.ascontiguousarray(context.images, np.float32))
    for block in tqdm(blocks, desc="reconstruct", unit="block"):
        target = reference.run_all(block, float_input)
        _learn(
            simulated, block, roundings, quantized_input, float_input, target, iterations, batch, drop_prob
        )
        quantized_input, float_input = simulated.run_all(block, quantized_input), target
    result = Reconstruction(blocks=blocks)
    inits = {init.name: init for init in model.graph.initializer}
    for layer, rounded in roundings.items():
        integers = rounded.rounding.integers()
        result.flipped[layer] = float(np.mean(integers != rounded.grid.quantize(rounded.weight)))
        set_initializer(inits[rounded.initializer], rounded.grid.dequantize(integers))
    result.ranges = {
        tensor: simulated.quantizers[source].learned_range() for tensor, source in stored.items()
    }
    return result


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


def activation_quantizers(
    reference: Simulation, model: onnx.ModelProto, context: Context
) -> dict[str, LearnedStep]:
    """A :class:`LearnedStep` for each stored activation that takes no other's quantization, started from
    the range ``calib`` computes on the FP32 model's values for the tensor's own integer grid
    (:func:`resnet8ptq.backends.onnx.widths.activation_qranges`), over the calibration batches."""
    from resnet8ptq.backends.onnx.widths import activation_qranges
    from resnet8ptq.calibration import RangeCollector, batches

    spec = context.spec
    sources = sorted(set(reference.stored.values()))
    qranges = activation_qranges(model, spec, sources)
    collectors = {name: RangeCollector(spec.calib) for name in sources}
    for images in batches(context.images, spec.calib.batch_size):
        values = reference.values(torch.from_numpy(np.ascontiguousarray(images, np.float32)))
        for name in sources:
            collectors[name].add(values[name].numpy())
    return {name: LearnedStep(*collectors[name].compute(qranges[name]), qranges[name]) for name in sources}


def weight_roundings(simulated: Simulation, model: onnx.ModelProto, spec: QuantSpec) -> dict[str, Rounded]:
    """A :class:`~._rounding.SoftRounding` of every conv/gemm weight on its grid, made the weight of the
    torch module that runs its ONNX node (a parametrization), by ONNX node name."""
    from torch.nn.utils import parametrize

    from resnet8ptq.layers import weight_widths
    from resnet8ptq.weight_grid import channel_axis, quantized_weights, weight_grid

    widths = weight_widths(model, spec)
    roundings = {}
    for name, (node, weight) in quantized_weights(model).items():
        grid = weight_grid(weight, channel_axis(node), spec, widths[name])
        rounding = SoftRounding(weight, grid)
        layer = _weighted(simulated.gm.get_submodule(node.name))
        transpose = tuple(layer.weight.shape) != weight.shape
        parametrize.register_parametrization(layer, "weight", RoundedWeight(rounding, transpose), unsafe=True)
        roundings[node.name] = Rounded(rounding, grid, weight, name)
    return roundings


def find_blocks(simulation: Simulation) -> list[Block]:
    """Cut the graph where a single tensor is passed on, and close a block at the first such cut after a
    conv/gemm whose tensor is a stored activation. Nodes after the last block (the softmax) are left out."""
    nodes = [node for node in simulation.gm.graph.nodes if node.op not in ("get_attr", "output")]
    position = {node: i for i, node in enumerate(nodes)}
    last_use = {
        node: max((position.get(user, len(nodes)) for user in node.users), default=0) for node in nodes
    }
    blocks, start, layers = [], 0, []
    for i, node in enumerate(nodes[1:], start=1):
        if node.op != "call_module":
            raise RuntimeError(f"block reconstruction: unexpected node {node.op} {node.target}")
        if _weighted(simulation.gm.get_submodule(node.target)) is not None:
            layers.append(node.target)
        live = [other for other in nodes[: i + 1] if last_use[other] > i]
        if live == [node] and layers and simulation.tensors.get(node.target) in simulation.stored:
            blocks.append(Block(nodes[start], tuple(nodes[start + 1 : i + 1]), tuple(layers)))
            start, layers = i, []
    return blocks


def _weighted(module: torch.nn.Module) -> torch.nn.Module | None:
    """The conv/linear module that runs a node (onnx2torch may wrap it, e.g. pad + conv), if any."""
    return next((m for m in module.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)), None)


def _learn(
    simulated: Simulation,
    block: Block,
    roundings: dict[str, Rounded],
    quantized_input: torch.Tensor,
    float_input: torch.Tensor,
    target: torch.Tensor,
    iterations: int,
    batch: int,
    drop_prob: float,
) -> None:
    """Fit one block's roundings and activation steps, then freeze them (hard rounding, fixed steps)."""
    block_roundings = [roundings[layer].rounding for layer in block.layers]
    steps = [simulated.quantizers[name] for name in dict.fromkeys(simulated.block_tensors(block))]
    steps = [step for step in steps if step.frozen is None]
    optimizer = torch.optim.Adam(
        [
            {"params": [rounding.v for rounding in block_roundings], "lr": ROUNDING_LR},
            {"params": [step.ratio for step in steps], "lr": STEP_LR},
        ]
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, [lambda _: 1.0, lambda i: 0.5 * (1 + math.cos(math.pi * i / iterations))]
    )
    for step in steps:
        step.drop_prob = drop_prob
    for iteration in range(iterations):
        index = torch.randint(len(quantized_input), (batch,))
        inputs = quantized_input[index]
        if drop_prob > 0:
            inputs = torch.where(torch.rand_like(inputs) < drop_prob, float_input[index], inputs)
        loss = F.mse_loss(simulated.run(block, inputs), target[index])
        beta = regularization(iteration, iterations)
        if beta is not None:
            loss = loss + REGULARIZATION * sum(rounding.regularizer(beta) for rounding in block_roundings)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    for rounding in block_roundings:
        rounding.hard = True
    for step in steps:
        step.drop_prob = 0.0
        step.freeze()
