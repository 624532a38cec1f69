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

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from resnet8ptq.algorithms._crossbar import CrossbarLayer, calibrate
from resnet8ptq.algorithms._rounding import REGULARIZATION, SoftRounding, regularization
from resnet8ptq.hardware import torch_threads
from resnet8ptq.simulation import (
    Block,
    LearnedStep,
    Simulation,
    stored_activations,
    weighted_module,
)
from resnet8ptq.weight_grid import WeightGrid

if TYPE_CHECKING:
    from resnet8ptq.device.adc import LayerSteps

if TYPE_CHECKING:
    import onnx

    from resnet8ptq.algorithms.base import Context
    from resnet8ptq.spec import QuantSpec

ROUNDING_LR = 1e-2  # Adam on AdaRound's v, as `adaround`
STEP_LR = 1e-3  # Adam on each activation step's ratio to its calibrated value, annealed to 0 (cosine)
ADC_LR = 1e-2  # Adam on each ADC's log2 step and window position (codes), annealed to 0 (cosine)
LEARNING_THREADS = 1  # torch threads while learning: the learned model must not depend on `threads`


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
    the blocks, the learned activation ranges by ONNX tensor and, learning against a crossbar, the learned
    ADC steps by layer (:func:`resnet8ptq.model.layer_name` of its output)."""

    flipped: dict[str, float] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    adc_steps: dict[str, LayerSteps] = field(default_factory=dict)


@dataclass(frozen=True)
class Learning:
    """What every block's learning shares: the quantized simulation, the weights' roundings and crossbar
    layers by ONNX node, and the settings."""

    simulated: Simulation
    roundings: dict[str, Rounded]
    crossbars: dict[str, CrossbarLayer]
    iterations: int
    batch: int
    drop_prob: float


class RoundedWeight(torch.nn.Module):
    """A parametrization: the module's weight is its soft rounding's (transposed for a ``Linear`` whose ONNX
    ``Gemm`` holds it as inputs x outputs)."""

    def __init__(self, rounding: SoftRounding, transpose: bool) -> None:
        super().__init__()
        self.rounding, self.transpose = rounding, transpose

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        weight = self.rounding()
        return weight.T if self.transpose else weight


def reconstruct(
    model: onnx.ModelProto, context: Context, iterations: int, batch: int, drop_prob: float = 0.0
) -> Reconstruction:
    """Learn the weights' rounding and the activations' steps block by block; write the weights back onto
    their grids in ``model`` (in place); return what was learned. Runs torch on one thread (then restores
    the count): over 2000 iterations per block, 1 and 2 threads learned different models (the gradients'
    sums run in another order), and `threads` is not part of a run's identity."""
    with torch_threads(LEARNING_THREADS):
        return _reconstruct(model, context, iterations, batch, drop_prob)


def _reconstruct(
    model: onnx.ModelProto, context: Context, iterations: int, batch: int, drop_prob: float
) -> Reconstruction:
    from tqdm import tqdm

    from resnet8ptq.algorithms._graph import set_initializer
    from resnet8ptq.device.graph import weight_key
    from resnet8ptq.model import layer_name

    torch.manual_seed(context.seed)
    stored = stored_activations(model)
    reference = Simulation(model, stored)
    simulated = Simulation(model, stored, activation_quantizers(reference, model, context))
    roundings = weight_roundings(simulated, model, context.spec)
    blocks = find_blocks(simulated)
    crossbars = crossbar_layers(simulated, model, roundings, context) if context.crossbar else {}
    learning = Learning(simulated, roundings, crossbars, iterations, batch, drop_prob)
    quantized_input = float_input = torch.from_numpy(np.ascontiguousarray(context.images, np.float32))
    for block in tqdm(blocks, desc="reconstruct", unit="block"):
        target = reference.run_all(block, float_input)
        if crossbars:  # the block's ADCs start from the calibrated steps on its input
            layers = [crossbars[layer] for layer in block.layers]
            calibrate(layers, functools.partial(simulated.run_all, block, quantized_input), context.crossbar)
        _learn(learning, block, quantized_input, float_input, target)
        quantized_input, float_input = simulated.run_all(block, quantized_input), target
    result = Reconstruction(blocks=blocks)
    inits = {init.name: init for init in model.graph.initializer}
    for layer, rounded in roundings.items():
        integers = rounded.rounding.integers()
        result.flipped[layer] = float(np.mean(integers != rounded.grid.quantize(rounded.weight)))
        set_initializer(inits[rounded.initializer], rounded.grid.dequantize(integers))
        if layer in crossbars:
            key = weight_key(centred_rows(integers, rounded.grid))
            result.adc_steps[layer_name(node_output(model, layer))] = crossbars[layer].learned(key)
    result.ranges = {
        tensor: simulated.quantizers[source].learned_range() for tensor, source in stored.items()
    }
    return result


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
        layer = weighted_module(simulated.gm.get_submodule(node.name))
        transpose = tuple(layer.weight.shape) != weight.shape
        parametrize.register_parametrization(layer, "weight", RoundedWeight(rounding, transpose), unsafe=True)
        roundings[node.name] = Rounded(rounding, grid, weight, name)
    return roundings


def crossbar_layers(
    simulated: Simulation, model: onnx.ModelProto, roundings: dict[str, Rounded], context: Context
) -> dict[str, CrossbarLayer]:
    """Every conv/gemm node of ``simulated`` replaced by a :class:`~._crossbar.CrossbarLayer` of the
    context's crossbar (its input's quantizer: the stored activation its input tensor takes), by ONNX node
    name."""
    inputs = {node.name: node.input[0] for node in model.graph.node}
    layers = {}
    for node, rounded in roundings.items():
        tensor = inputs[node]
        if tensor not in simulated.stored:
            raise RuntimeError(f"device-aware learning: {node}'s input {tensor} is not quantized.")
        step = simulated.quantizers[simulated.stored[tensor]]
        original = simulated.gm.get_submodule(node)
        layers[node] = CrossbarLayer(node, original, rounded.rounding, step, context.crossbar, context.seed)
        parent, _, child = node.rpartition(".")
        setattr(simulated.gm.get_submodule(parent) if parent else simulated.gm, child, layers[node])
    return layers


def centred_rows(integers: np.ndarray, grid: WeightGrid) -> np.ndarray:
    """A weight's integers less its zero points, outputs first (as the device holds them)."""
    shape = [1] * integers.ndim
    shape[grid.axis] = -1
    centred = integers.astype(np.int64) - grid.zero_point.astype(np.int64).reshape(shape)
    return np.moveaxis(centred, grid.axis, 0)


def node_output(model: onnx.ModelProto, name: str) -> str:
    """The first output tensor of the ONNX node ``name``."""
    return next(node.output[0] for node in model.graph.node if node.name == name)


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
        if weighted_module(simulation.gm.get_submodule(node.target)) is not None:
            layers.append(node.target)
        live = [other for other in nodes[: i + 1] if last_use[other] > i]
        if live == [node] and layers and simulation.tensors.get(node.target) in simulation.stored:
            blocks.append(Block(nodes[start], tuple(nodes[start + 1 : i + 1]), tuple(layers)))
            start, layers = i, []
    return blocks


def _learn(
    learning: Learning,
    block: Block,
    quantized_input: torch.Tensor,
    float_input: torch.Tensor,
    target: torch.Tensor,
) -> None:
    """Fit one block's roundings, activation steps and (on a crossbar) ADC steps, then freeze them (hard
    rounding, fixed steps)."""
    simulated, iterations, batch, drop_prob = (
        learning.simulated, learning.iterations, learning.batch, learning.drop_prob,
    )  # fmt: skip
    block_roundings = [learning.roundings[layer].rounding for layer in block.layers]
    steps = [simulated.quantizers[name] for name in dict.fromkeys(simulated.block_tensors(block))]
    steps = [step for step in steps if step.frozen is None]
    adcs = [learning.crossbars[layer] for layer in block.layers if layer in learning.crossbars]
    optimizer = torch.optim.Adam(
        [
            {"params": [rounding.v for rounding in block_roundings], "lr": ROUNDING_LR},
            {"params": [step.ratio for step in steps], "lr": STEP_LR},
            {"params": [p for adc in adcs for p in adc.parameters_to_learn()], "lr": ADC_LR},
        ]
    )
    cosine = lambda i: 0.5 * (1 + math.cos(math.pi * i / iterations))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda _: 1.0, cosine, cosine])
    for step in steps:
        step.drop_prob = drop_prob
    for adc in adcs:
        adc.noisy = True  # a new chip per iteration, where the crossbar's cells draw (algo.device_noise)
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
    for adc in adcs:
        adc.noisy = False
        adc.freeze()
