"""The crossbar's non-idealities as composable steps (resnet8ptq.device.effects): each effect's arithmetic
against a hand computation, the crossbar applying whatever effects it is given in their step, and the ideal
crossbar (calibration's) without any of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest
import torch

from resnet8ptq.device import effects
from resnet8ptq.device.cim import READ_STREAM, CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.effects import Effect, ProgrammingNoise
from resnet8ptq.device.executor import Ideal
from tests.unit.test_device import centred_input, conv_layer

pytestmark = pytest.mark.device


@dataclass(frozen=True)
class AddToCells(Effect):
    """A toy cell effect: every programmed level + ``offset`` (no draw)."""

    offset: float
    step: ClassVar[str] = "perturb"

    def apply(self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator) -> torch.Tensor:
        return values + self.offset


@dataclass(frozen=True)
class ReadOffset(Effect):
    """A toy read effect: every partial sum + one standard normal draw per tensor, recorded."""

    drawn: list[float] = field(default_factory=list, compare=False)
    step: ClassVar[str] = "read"
    draws: ClassVar[bool] = True

    def apply(self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator) -> torch.Tensor:
        draw = float(torch.randn(1, generator=generator, dtype=torch.float64))
        self.drawn.append(draw)
        return values + draw


def test_programming_noise_is_sigma_times_the_cell_range_times_a_normal_draw() -> None:
    levels = torch.tensor([[0.0, 3.0, -2.0], [1.0, 0.0, 3.0]], dtype=torch.float64)
    crossbar = Crossbar(bits_per_cell=2, weight_noise=0.1)
    noisy = ProgrammingNoise(0.1).apply(levels, crossbar, torch.Generator().manual_seed(5))
    normal = torch.randn((2, 3), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.allclose(noisy, levels + 0.1 * 3 * normal, rtol=0, atol=1e-15)  # 2-bit cells: range 3
    assert ProgrammingNoise.configured(crossbar) == ProgrammingNoise(0.1)
    assert ProgrammingNoise.configured(Crossbar()) is None


def test_the_ideal_crossbar_has_no_effect_and_the_settings_switch_them_on() -> None:
    noisy = Crossbar(rows=64, adc_bits=4, weight_noise=0.05)
    assert [effects.configured(noisy, step) for step in effects.STEPS] == [
        [ProgrammingNoise(0.05)],
        [],
        [],
        [],
    ]
    assert all(effects.configured(noisy.ideal(), step) == [] for step in effects.STEPS)
    with pytest.raises(ValueError, match="step 'write'"):
        effects.configured(noisy, "write")
    assert (
        DeviceConfig(kind="cim", weight_noise=0.05).noisy
        and DeviceConfig(kind="cim", weight_noise=0.05).seeds == 5
    )
    assert not DeviceConfig(kind="cim", rows=64).noisy and DeviceConfig(kind="cim", rows=64).seeds == 1


def test_a_cell_effect_changes_the_programmed_levels_of_every_slice() -> None:
    """A perturb-step effect given to the crossbar acts on each weight slice's cells: a constant offset c on
    every cell adds c · Σ x over the tile's terms, per weight slice times its significance."""
    rng = np.random.default_rng(11)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    crossbar = Crossbar(bits_per_cell=4, cells_per_weight=2)
    plain = CrossbarArithmetic(crossbar).accumulate(layer, x)
    shifted = CrossbarArithmetic(crossbar, effects=[AddToCells(1.0)]).accumulate(layer, x)
    ones = Conv1 = torch.nn.functional.conv2d(
        torch.nn.functional.pad(x, (1, 1, 1, 1)), torch.ones(1, layer.weight.shape[1], 3, 3)
    )
    del Conv1
    assert torch.equal(
        shifted - plain, ones.double().expand_as(plain) * (1 + 2**4)
    )  # slices at shifts 0 and 4
    assert torch.equal(plain, Ideal().accumulate(layer, x).double())


def test_a_read_effect_draws_from_its_own_stream_and_leaves_the_chip_as_programmed() -> None:
    rng = np.random.default_rng(12)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    crossbar = Crossbar(rows=64, weight_noise=0.02)
    chip = CrossbarArithmetic(crossbar, seed=3)
    read_effect = ReadOffset()
    reading = CrossbarArithmetic(crossbar, seed=3, effects=[ProgrammingNoise(0.02), read_effect])
    assert reading.effects["read"] == [read_effect]
    acc, plain = reading.accumulate(layer, x), chip.accumulate(layer, x)
    for (cells, _), (same, _) in zip(reading.weight_slices(layer), chip.weight_slices(layer), strict=True):
        assert torch.equal(cells, same)  # the read stream did not move the chip's draws
    tiles = 3  # 144 terms at 64 rows
    assert len(read_effect.drawn) == tiles
    expected = torch.randn(
        tiles, generator=torch.Generator().manual_seed(3 + READ_STREAM), dtype=torch.float64
    )
    assert read_effect.drawn == expected.tolist()
    # An ideal ADC rounds each tile's partial sums: the offset moves them by its rounding, tile by tile.
    assert not torch.equal(acc, plain)
