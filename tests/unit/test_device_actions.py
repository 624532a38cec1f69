"""One inference's actions on the device (resnet8ptq/device/actions.py): the ADC conversions and driven rows
counted equal what the crossbar simulator actually converts and reads, for tiles, bit-serial signed inputs,
sliced weights and column groups, on conv, depthwise (block-diagonal) and dense layers; the arrays of a
block-diagonal layer and the statistics equal a hand count; bad array sizes are refused."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from resnet8ptq.device.actions import LayerActions, count_actions, mean_cell, mean_input, totals
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.graph import Conv, IntegerModel, Quant
from resnet8ptq.device.mapping import tile_sizes
from tests.unit.test_device import conv_layer

IMAGES, SIDE = 3, 6


class Counting(CrossbarArithmetic):
    """The crossbar simulator, counting the partial sums it converts and the rows each read drives."""

    conversions = driven_rows = 0

    def read(self, layer: Conv, tile: int, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        partial = super().read(layer, tile, x, weight)
        applied = partial.shape[0]  # input slices x images
        rows = tile_sizes(layer.terms, self.crossbar.rows)[tile] * layer.groups  # each group's own rows
        self.driven_rows += rows * applied * partial.shape[2] * partial.shape[3]
        return partial

    def convert(self, layer: Conv, tile: int, partial: torch.Tensor, scaled: bool = True) -> torch.Tensor:
        self.conversions += partial.numel()
        return super().convert(layer, tile, partial, scaled)


def layer_of(kind: str, rng: np.random.Generator) -> tuple[Conv, int]:
    """A 12-output layer of ``kind`` (conv 3x3 over 16 channels, depthwise 3x3 over 4 channels with a depth
    multiplier of 3, dense over 16 inputs) and its output side."""
    layer = conv_layer(rng, channels_in=16, channels_out=12)
    if kind == "depthwise":  # 4 channels, depth multiplier 3: 12 outputs, 9 terms each
        return dataclasses.replace(conv_layer(rng, channels_in=1, channels_out=12), groups=4), SIDE
    if kind == "dense":
        weight = rng.integers(-127, 128, (12, 16, 1, 1)).astype(np.int32)
        return dataclasses.replace(layer, weight=weight, padding=(0, 0, 0, 0), dense=True), 1
    return layer, SIDE


def signed_input(layer: Conv) -> Conv:
    """The layer reading int8 inputs with zero point 0: centred inputs -128..127, two's-complement slices."""
    return dataclasses.replace(layer, input_quant=Quant(0.05, 0, -128, 127))


@pytest.mark.parametrize(
    ("crossbar", "signed"),
    [
        (Crossbar(), False),
        (Crossbar(rows=50), False),
        (Crossbar(rows=40, dac_bits=3), True),
        (Crossbar(rows=64, dac_bits=1, bits_per_cell=4, cells_per_weight=2, columns=16), False),
        (Crossbar(rows=7, dac_bits=2, bits_per_cell=2, cells_per_weight=4), True),
    ],
    ids=["one-tile", "tiles", "signed-3-bit-dac", "bit-serial-sliced-columns", "2-bit-cells"],
)
@pytest.mark.parametrize("kind", ["conv", "depthwise", "dense"])
def test_conversions_and_driven_rows_are_the_simulators(crossbar: Crossbar, signed: bool, kind: str) -> None:
    rng = np.random.default_rng(0)
    layer, side = layer_of(kind, rng)
    layer = signed_input(layer) if signed else layer
    low = -128 if signed else 0
    channels = layer.weight.shape[1] * layer.groups
    x = torch.from_numpy(rng.integers(low, low + 256, (IMAGES, channels, side, side)).astype(np.float32))
    simulator = Counting(crossbar)
    simulator.accumulate(layer, x)
    columns = crossbar.columns or math.inf
    (counted,) = count_actions(
        IntegerModel("test", "x", layer.input_quant, "half_to_even", [layer]),
        {"y": (12, side, side)},
        crossbar,
        columns,
    )
    assert counted.mapping == "crossbar" and counted.groups == layer.groups
    assert counted.adc_conversions * IMAGES == simulator.conversions
    w_slices, per_group = crossbar.cells_per_weight, 12 // layer.groups
    groups = 1 if crossbar.columns is None else math.ceil(2 * w_slices * per_group / columns)
    assert counted.column_groups == groups
    assert counted.row_activations * IMAGES == simulator.driven_rows * groups
    # a driven row crosses its group's columns: the pair's two cells per weight slice and output
    assert counted.cell_reads * IMAGES == simulator.driven_rows * 2 * w_slices * per_group
    assert counted.macs == side * side * 12 * layer.terms
    readings = counted.input_slices * counted.weight_slices
    assert counted.shift_adds == counted.adc_conversions // readings * (readings - 1)
    assert counted.cells == 2 * w_slices * 12 * layer.terms
    assert counted.cells <= counted.array_cells
    if layer.groups == 1 or counted.blocks_per_array == 1:
        assert counted.arrays == layer.groups * counted.tiles * groups


def test_a_depthwise_layer_is_packed_block_diagonally_by_hand() -> None:
    """16 depthwise 3x3 kernels, one cell per weight: a kernel is 9 rows by a pair of columns. 128 rows
    hold 14 kernels along the diagonal: 2 arrays of 128 rows x 28 columns (columns null: those in use), 288
    cells of 7,168; 16-column arrays hold 8 kernels (16 / 2): 2 arrays of 128 x 16. With ``depthwise=digital``
    the layer is digital MACs only."""
    layer = dataclasses.replace(
        conv_layer(np.random.default_rng(4), channels_in=1, channels_out=16), groups=16
    )
    model = IntegerModel("t", "x", layer.input_quant, "half_to_even", [layer])
    shapes = {"y": (16, 4, 4)}
    (free,) = count_actions(model, shapes, Crossbar(rows=128), math.inf)
    assert (free.blocks_per_array, free.arrays, free.array_cells, free.cells) == (14, 2, 2 * 128 * 28, 288)
    assert totals([free])["array_cells"] == 7168
    (narrow,) = count_actions(model, shapes, Crossbar(rows=128, columns=16), 16)
    assert (narrow.blocks_per_array, narrow.arrays, narrow.array_cells) == (8, 2, 2 * 128 * 16)
    assert narrow.row_activations == 16 * 16 * 9  # positions x each kernel's 9 rows
    (short,) = count_actions(model, shapes, Crossbar(rows=4), math.inf)  # 9 terms over 3 tiles: no packing
    assert (short.blocks_per_array, short.tiles, short.arrays) == (1, 3, 48)
    (digital,) = count_actions(model, shapes, Crossbar(rows=128, depthwise="digital"), math.inf)
    assert (digital.mapping, digital.macs, digital.arrays, digital.adc_conversions) == (
        "digital",
        16 * 16 * 9,
        0,
        0,
    )


def test_the_integer_device_counts_digital_work_only() -> None:
    layer = conv_layer(np.random.default_rng(1), channels_in=4, channels_out=2)
    (counted,) = count_actions(
        IntegerModel("t", "x", layer.input_quant, "half_to_even", [layer]), {"y": (2, 5, 5)}, None, math.inf
    )
    assert (counted.macs, counted.requantizations, counted.adc_conversions, counted.arrays) == (
        5 * 5 * 2 * 36,
        50,
        0,
        0,
    )
    assert math.isnan(counted.mean_input)
    assert totals([counted, counted])["macs"] == 2 * counted.macs


def test_mean_input_by_hand() -> None:
    """Inputs 0..255 (unsigned, 8 bits): two values, 3 (twice) and 255 (once). At 8 bits a cycle: (3/255 · 2 +
    1) / 3; at 4 bits: slices 3 = (3, 0) and 255 = (15, 15), so ((3/15 · 2 + 1) / 3 + (0 + 1) / 3) / 2."""
    layer = conv_layer(np.random.default_rng(2))
    counts = np.zeros(256)
    counts[3], counts[255] = 2, 1
    assert mean_input(layer, counts, (0, 255), 8) == pytest.approx((3 / 255 * 2 + 1) / 3)
    assert mean_input(layer, counts, (0, 255), 4) == pytest.approx(((3 / 15 * 2 + 1) / 3 + 1 / 3) / 2)
    clipped = mean_input(layer, counts, (0, 127), 8)  # the DAC clips 255 to 127, 7 bits
    assert clipped == pytest.approx((3 / 127 * 2 + 1) / 3)


def test_mean_cell_by_hand() -> None:
    layer = conv_layer(np.random.default_rng(3), channels_in=1, channels_out=1)
    layer = dataclasses.replace(layer, weight=np.array([[[[5, -255, 0], [0, 0, 0], [0, 0, 16]]]], np.int32))
    one_cell = mean_cell(layer, Crossbar())
    assert one_cell == pytest.approx((5 + 255 + 16) / 9 / 255 / 2)
    nibbles = mean_cell(layer, Crossbar(bits_per_cell=4, cells_per_weight=2))  # 5=(5,0) 255=(15,15) 16=(0,1)
    assert nibbles == pytest.approx((5 + 15 + 15 + 1) / 18 / 15 / 2)


def test_an_array_narrower_than_a_weights_pair_is_refused() -> None:
    with pytest.raises(ValueError, match=r"device\.columns=3: expected >= 4 .*or null"):
        DeviceConfig(kind="cim", columns=3, cells_per_weight=2)
    assert DeviceConfig(kind="cim", rows=128, columns=128).label == "cim-r128-col128"


def test_every_count_is_a_field() -> None:
    names = {item.name for item in dataclasses.fields(LayerActions)}
    assert set(totals([])) <= names
