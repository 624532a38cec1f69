"""What one inference does on the device, counted exactly per layer: the actions a chip's components perform
(Accelergy's and CiMLoop's word: a component's energy is its energy per action times its action count), and
the two statistics their energy models take. The counts follow the crossbar that
:class:`~resnet8ptq.device.cim.CrossbarArithmetic` simulates, setting by setting, for one image:

* a conv/dense layer has O outputs (crossbar columns), K = C_in·kh·kw terms (crossbar rows) and P output
  positions (H'·W'; 1 for a dense layer); its K rows are split into T row tiles
  (:func:`~resnet8ptq.device.mapping.tile_sizes`), its inputs applied in S_x slices of ``dac_bits``
  (:func:`~resnet8ptq.device.mapping.slice_shifts` over the DAC's input window), its weights stored as a
  differential pair of cells per weight slice, S_w = ``cells_per_weight`` slices;
* **arrays**: T row tiles × G column groups, G = ceil(2·S_w·O / ``columns``) (the pair's two cells on two
  columns; ``columns``, an array's bit lines, is a property of the chip, not of the simulation);
* a **grouped (depthwise) layer** on crossbars (``depthwise=crossbar``) is block-diagonal: each of its g
  groups a block of K = C_in/g·kh·kw rows and 2·S_w·O/g columns (G column groups of it), packed side by
  side along the diagonal, B = min(rows // K, columns // (2·S_w·O/g)) blocks to an array when a block fits
  one (``rows`` null: as many as there are), else each block on its own T × G arrays; its rows are
  g·K·G, its arrays ceil(g / B), or g·T·G. With ``depthwise=digital`` it is digital MACs, as on the integer
  device;
* **array cells** and **utilisation**: the arrays' cells (``rows`` × ``columns``; null: the rows and
  columns in use) and the share of them the weights take;
* **row activations** and **DAC conversions**: every row of every array driven once per input slice and
  output position, P·S_x·K·g·G (each array has its own row drivers);
* **cell reads**: every cell on a driven row, P·S_x·K·2·S_w·O;
* **ADC conversions**: one per partial sum (tile × input slice × weight slice × output: the pair is read as
  one difference), P·O·T·S_x·S_w, exactly the readings the simulator converts;
* **shift-adds**: each tile's S_x·S_w readings of a column combined, P·O·T·(S_x·S_w - 1);
* **accumulator adds**: the bias preloads the register and each tile's column is added, P·O·T;
* **requantizations**: one per output element of a conv/dense, residual add or pooling layer;
* **residual adds** (an add layer's, or one fused into a conv) and **pooling adds** (a global average pool's
  sums: its input elements less its outputs);
* **MACs**: P·O·K, the multiply-accumulates the layer computes (on the integer device: its digital MACs).

The statistics, per layer: ``mean_input``, the mean DAC level on a driven row as a fraction of its top level
(each input slice's digit magnitude over 2^width - 1), from the layer's inputs on every fourth calibration
image (:class:`~resnet8ptq.device.dac.InputProfile`: exact counts per value); ``mean_cell``, the mean level
of the layer's cells (both of each pair) as a fraction of 2^``bits_per_cell`` - 1.

Not counted: reading the weights into the arrays (programming happens once, not per inference), moving
activations between layers (buffers, interconnect) and any control logic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.dac import profiled_inputs
from resnet8ptq.device.executor import execute
from resnet8ptq.device.graph import Add, AveragePool, Conv, IntegerModel, MaxPool
from resnet8ptq.device.mapping import (
    dac_window,
    input_range,
    on_crossbar,
    slice_shifts,
    slices,
    tile_sizes,
    value_bits,
)

STATISTICS_EVERY = 4
"""The input statistics are measured on every fourth calibration image (250 of the default 1,000, all
classes): a mean level, for a small part of a device run's time."""
COUNTED = (
    "macs", "row_activations", "dac_conversions", "cell_reads", "adc_conversions", "shift_adds",
    "accumulator_adds", "requantizations", "residual_adds", "pooling_adds",
)  # fmt: skip
"""The actions of one inference, summed over the layers for the run's totals."""


@dataclass(frozen=True)
class LayerActions:
    """One layer's actions per image and what its components' energy models take."""

    layer: str
    kind: str  # conv | dense | add | pool
    output_elements: int
    outputs: int = 0  # conv/dense: output channels (crossbar columns before the pair and slices)
    terms: int = 0  # conv/dense: terms per output, C_in·kh·kw (crossbar rows before tiling)
    positions: int = 0  # conv/dense: output positions per image, H'·W' (1 for a dense layer)
    macs: int = 0
    mapping: str = ""  # conv/dense: crossbar | digital (the integer device's, a depthwise=digital layer's)
    groups: int = 1  # conv: input-channel groups (a depthwise layer's: one per channel)
    tiles: int = 0
    column_groups: int = 0  # per group: a block's column groups
    blocks_per_array: int = 0  # crossbar: group blocks side by side in one array (1: an ungrouped layer)
    arrays: int = 0
    cells: int = 0
    array_cells: int = 0  # crossbar: the cells of the layer's arrays, used or not
    input_slices: int = 0
    weight_slices: int = 0
    row_activations: int = 0
    dac_conversions: int = 0
    cell_reads: int = 0
    adc_conversions: int = 0
    shift_adds: int = 0
    accumulator_adds: int = 0
    requantizations: int = 0
    residual_adds: int = 0
    pooling_adds: int = 0
    mean_input: float = math.nan
    mean_cell: float = math.nan


def device_actions(
    model: IntegerModel,
    device: DeviceConfig,
    image: np.ndarray,
    calibration_images: np.ndarray,
    profiles: dict[tuple, object] | None = None,
    dac_ranges: dict[str, tuple[int, int]] | None = None,
) -> list[LayerActions]:
    """:func:`count_actions` of ``model`` on ``device`` (``integer``: digital MACs; ``cim``: its crossbar):
    the tensors' shapes from ``image`` (one, NHWC), the inputs' statistics from every
    :data:`STATISTICS_EVERY`-th calibration image on the ideal integer device (kept in ``profiles`` for the
    next device run of the same model, as :func:`~resnet8ptq.device.evaluate.dac_ranges` keeps them)."""
    crossbar = device.crossbar() if device.kind == "cim" else None
    counts = None
    if crossbar is not None and len(calibration_images):
        profiled = {} if profiles is None else profiles
        profile = profiled_inputs(model, calibration_images, profiled, device.batch_size, STATISTICS_EVERY)
        counts = {name: count.numpy() for name, count in profile.counts.items()}
    _, trace = execute(model, image, trace_images=1, batch_size=1)
    shapes = {name: tuple(tensor.shape[1:]) for name, tensor in trace.outputs.items()}
    columns = (crossbar.columns if crossbar else None) or math.inf
    return count_actions(model, shapes, crossbar, columns, counts, dac_ranges)


def count_actions(
    model: IntegerModel,
    shapes: dict[str, tuple[int, ...]],
    crossbar: Crossbar | None,
    columns: float,
    input_counts: dict[str, np.ndarray] | None = None,
    dac_ranges: dict[str, tuple[int, int]] | None = None,
) -> list[LayerActions]:
    """Every layer's actions for one image. ``shapes``: each tensor's shape for one image (the layer outputs'
    and the model input's); ``crossbar``: None for the integer device (digital MACs only); ``columns``: an
    array's columns (``math.inf``: one array holds a row tile's every column); ``input_counts``: per
    conv/dense layer, its inputs' counts per value of :func:`~resnet8ptq.device.mapping.input_range` (for
    ``mean_input``); ``dac_ranges``: a calibrated DAC's."""
    counted: list[LayerActions] = []
    for layer in model.layers:
        out = int(np.prod(shapes[layer.output]))
        if isinstance(layer, Conv):
            counted.append(_conv(layer, out, crossbar, columns, input_counts, dac_ranges))
        elif isinstance(layer, Add):
            counted.append(LayerActions(layer.name, "add", out, residual_adds=out, requantizations=out))
        elif isinstance(layer, AveragePool):
            adds = int(np.prod(shapes[layer.input])) - out
            counted.append(LayerActions(layer.name, "pool", out, pooling_adds=adds, requantizations=out))
        elif isinstance(layer, MaxPool):  # comparisons: not an action the cost model prices yet
            counted.append(LayerActions(layer.name, "max_pool", out))
    return counted


def _conv(
    layer: Conv,
    out: int,
    crossbar: Crossbar | None,
    columns: float,
    input_counts: dict[str, np.ndarray] | None,
    dac_ranges: dict[str, tuple[int, int]] | None,
) -> LayerActions:
    outputs, terms = len(layer.weight), layer.terms
    positions = out // outputs
    digital = {
        "layer": layer.name,
        "kind": "dense" if layer.dense else "conv",
        "output_elements": out,
        "outputs": outputs,
        "terms": terms,
        "positions": positions,
        "macs": positions * outputs * terms,
        "groups": layer.groups,
        "requantizations": out,
        "residual_adds": out if layer.residual is not None else 0,
    }
    if crossbar is None or not on_crossbar(layer, crossbar):
        return LayerActions(**digital, mapping="digital")
    window = dac_window(layer, dac_ranges)
    in_bits, _ = value_bits(*window)
    x_slices = len(slice_shifts(crossbar.dac_bits, in_bits))
    w_slices = crossbar.cells_per_weight
    sizes = tile_sizes(terms, crossbar.rows)
    tiles, blocks = len(sizes), layer.groups
    width = 2 * w_slices * outputs // blocks  # a group block's columns: the pair's two per weight slice
    groups = max(1, math.ceil(width / columns))  # columns=inf: one group
    per_array = 1
    if blocks > 1 and tiles == 1 and groups == 1:  # block-diagonal: blocks side by side along the diagonal
        fit_rows = crossbar.rows // terms if crossbar.rows else blocks
        fit_columns = blocks if math.isinf(columns) else int(columns // width)
        per_array = max(1, min(fit_rows, fit_columns, blocks))
    arrays = math.ceil(blocks / per_array) * tiles * groups  # packed blocks have one tile and column group
    array_rows = crossbar.rows or sizes[0] * per_array
    array_columns = crossbar.columns or math.ceil(width / groups) * per_array
    counts = (input_counts or {}).get(layer.name)
    # rows driven: every array's, once per input slice
    driven = positions * x_slices * terms * blocks * groups
    return LayerActions(
        **digital,
        mapping="crossbar",
        tiles=tiles,
        column_groups=groups,
        blocks_per_array=per_array,
        arrays=arrays,
        cells=2 * w_slices * outputs * terms,
        array_cells=arrays * array_rows * array_columns,
        input_slices=x_slices,
        weight_slices=w_slices,
        row_activations=driven,
        dac_conversions=driven,  # one DAC a row
        cell_reads=positions * x_slices * terms * 2 * w_slices * outputs,
        adc_conversions=positions * outputs * tiles * x_slices * w_slices,
        shift_adds=positions * outputs * tiles * (x_slices * w_slices - 1),
        accumulator_adds=positions * outputs * tiles,
        mean_input=math.nan if counts is None else mean_input(layer, counts, window, crossbar.dac_bits),
        mean_cell=mean_cell(layer, crossbar),
    )


def mean_input(layer: Conv, counts: np.ndarray, window: tuple[int, int], dac_bits: int) -> float:
    """The mean DAC level on a driven row, a fraction of its top level: every input value (``counts`` per
    value of the layer's input range) clipped to the DAC's ``window`` and cut into ``dac_bits`` slices as the
    crossbar cuts it (:func:`~resnet8ptq.device.mapping.slices`), each slice's |digit| over 2^width - 1,
    averaged over the slices and weighted by the counts."""
    low, high = input_range(layer)
    values = torch.from_numpy(np.clip(np.arange(low, high + 1), *window).astype(np.float64))
    bits, signed = value_bits(*window)
    weights = np.asarray(counts, dtype=np.float64)
    levels = [
        np.average(digit.abs().numpy() / ((1 << min(dac_bits, bits - shift)) - 1), weights=weights)
        for digit, shift in slices(values, dac_bits, bits, signed)
    ]
    return float(np.mean(levels))


def mean_cell(layer: Conv, crossbar: Crossbar) -> float:
    """The mean level of the layer's cells, a fraction of the top level: each weight's magnitude cut into
    ``cells_per_weight`` digits of ``bits_per_cell`` as the crossbar programs them (the other cell of each
    pair at zero)."""
    bits = crossbar.bits_per_cell
    magnitude = torch.from_numpy(np.abs(layer.centered_weight).astype(np.float64))
    digits = [digit for digit, _ in slices(magnitude, bits, bits * crossbar.cells_per_weight, signed=False)]
    return float(torch.stack(digits).mean()) / ((1 << bits) - 1) / 2


def totals(counted: list[LayerActions]) -> dict[str, int]:
    """The actions of one inference, summed over the layers (:data:`COUNTED`), with the chip's arrays and
    cells."""
    summed = {name: sum(getattr(layer, name) for layer in counted) for name in COUNTED}
    chip = {
        name: sum(getattr(layer, name) for layer in counted) for name in ("arrays", "cells", "array_cells")
    }
    return summed | chip


def utilisation(counted: list[LayerActions]) -> float:
    """The share of the arrays' cells the weights take (NaN without arrays: the integer device)."""
    chip = totals(counted)
    return chip["cells"] / chip["array_cells"] if chip["array_cells"] else math.nan


def table(counted: list[LayerActions]) -> list[dict]:
    """One row per layer, every field (the run's ``device/actions.csv``)."""
    return [asdict(layer) for layer in counted]
