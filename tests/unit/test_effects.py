"""The crossbar's non-idealities as composable steps (resnet8ptq.device.effects): each effect's arithmetic
against a hand computation, the crossbar applying whatever effects it is given in their step, and the ideal
crossbar (calibration's) without any of them."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest
import torch

from resnet8ptq.device import cim, effects
from resnet8ptq.device.adc import Geometry, LayerSteps
from resnet8ptq.device.cells import CELL_FRACTION_BITS, cell_digits
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.effects import (
    AdcErrors,
    ChargeLoss,
    Drift,
    Effect,
    ProgrammingNoise,
    ReadNoise,
    StuckCells,
    charge_loss,
)
from resnet8ptq.device.effects.base import ReadStream, Site, _seeded
from resnet8ptq.device.executor import Ideal, integer_conv2d
from tests.unit.test_device import centred_input, conv_layer

pytestmark = pytest.mark.device

SITE = Site(seed=0, layer="conv")


@dataclass(frozen=True)
class AddToCells(Effect):
    """A toy cell effect: every programmed level + ``offset`` (no draw)."""

    offset: float
    step: ClassVar[str] = "perturb"

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site
    ) -> torch.Tensor:
        return values + self.offset


@dataclass(frozen=True)
class ReadOffset(Effect):
    """A toy read effect: every partial sum + one standard normal draw from the read stream, recorded."""

    drawn: list[torch.Tensor] = field(default_factory=list, compare=False)
    step: ClassVar[str] = "read"
    draws: ClassVar[bool] = True

    def apply(self, values: torch.Tensor, crossbar: Crossbar, generator: ReadStream, site) -> torch.Tensor:
        draw = generator.randn(values.shape, torch.float64)
        self.drawn.append(draw)
        return values + draw


def test_programming_noise_is_sigma_times_the_cell_range_times_a_normal_draw() -> None:
    levels = torch.tensor([[0.0, 3.0, -2.0], [1.0, 0.0, 3.0]], dtype=torch.float64)
    crossbar = Crossbar(bits_per_cell=2, weight_noise=0.1)
    noisy = ProgrammingNoise(0.1).apply(levels, crossbar, torch.Generator().manual_seed(5), SITE)
    normal = torch.randn((2, 3), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.allclose(noisy, levels + 0.1 * 3 * normal, rtol=0, atol=1e-15)  # 2-bit cells: range 3
    assert ProgrammingNoise.configured(crossbar) == ProgrammingNoise(0.1)
    assert ProgrammingNoise.configured(Crossbar()) is None


@pytest.mark.parametrize("model", ["proportional", "pcm_signed", "sonos"])
def test_a_devices_programming_noise_depends_on_the_level_written(model: str) -> None:
    """CrossSim's proportional error: σ = ĝ of the range (weight_noise 1), aihwkit's PCM fit:
    σ = (0.26348 + 1.9650 ĝ - 1.1731 ĝ²) / 25 of the range; CrossSim's SONOS fit:
    σ = 19.88665 (1 - exp(-I / 176.3115)) / Imax, I = ĝ · Imax, Imax = 0.06 V / 35 kΩ = 1714.29 nA."""
    levels = torch.tensor([[0.0, 255.0, -51.0]], dtype=torch.float64)
    noisy = ProgrammingNoise(1.0, model).apply(levels, Crossbar(), torch.Generator().manual_seed(8), SITE)
    normal = torch.randn((1, 3), generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    g = [0.0, 1.0, 0.2]
    if model == "proportional":
        sigma = g  # a level's own size: 51 levels of σ at level 51
    elif model == "pcm_signed":
        sigma = [(0.26348 + 1.9650 * x - 1.1731 * x * x) / 25 for x in g]
        assert sigma[1] == pytest.approx(0.0422, abs=1e-4)  # 4.2 % of the range at the top level
    else:
        sigma = [19.88665 * (1 - math.exp(-x * 1714.2857 / 176.3115)) / 1714.2857 for x in g]
        assert sigma[0] == 0 and sigma[1] == pytest.approx(0.0116, abs=1e-4)  # none at 0, 1.2 % at the top
    expected = levels + torch.tensor([sigma], dtype=torch.float64) * 255 * normal
    assert torch.allclose(noisy, expected, rtol=1e-6, atol=0)
    unshaped = "device.weight_noise_model=pcm with device.weight_noise=0"
    with pytest.raises(ValueError, match=re.escape(unshaped)):
        DeviceConfig(kind="cim", weight_noise_model="pcm")


def test_pcm_programming_noise_is_aihwkits_on_both_cells_of_the_pair_clamped_at_zero() -> None:
    """aihwkit's PCMLikeNoiseModel programs g+ and g- of a weight's pair each with σ(g_target) and clamps each
    at 0: the empty cell (target 0) gets σ(0) = 0.26348 / 25 of the range, positive only; the weight is
    g+ - g-. The positive cell draws first, then the negative one, from the chip's generator."""
    levels = torch.tensor([[0.0, 255.0, -51.0, 2.0]], dtype=torch.float64)
    noisy = ProgrammingNoise(1.0, "pcm").apply(levels, Crossbar(), torch.Generator().manual_seed(8), SITE)
    generator = torch.Generator().manual_seed(8)
    n_pos, n_neg = (torch.randn((1, 4), generator=generator, dtype=torch.float64) for _ in range(2))

    def sigma(level: torch.Tensor) -> torch.Tensor:
        g = level / 255
        return (0.26348 + 1.9650 * g - 1.1731 * g * g) / 25 * 255

    positive, negative = levels.clamp(min=0), (-levels).clamp(min=0)
    expected = (positive + sigma(positive) * n_pos).clamp(min=0) - (negative + sigma(negative) * n_neg).clamp(
        min=0
    )
    assert torch.allclose(noisy, expected, rtol=1e-12, atol=0)
    many = ProgrammingNoise(1.0, "pcm").apply(
        torch.zeros((1, 20_000), dtype=torch.float64), Crossbar(), torch.Generator().manual_seed(1), SITE
    )
    sigma_0 = 0.26348 / 25 * 255  # σ at level 0; max(σn, 0): mean σ/√(2π), variance σ²(1/2 - 1/(2π))
    assert float(many.mean()) == pytest.approx(0, abs=0.05)  # the two cells' clamped noise cancels on average
    assert float(many.std()) == pytest.approx(math.sqrt(1 - 1 / math.pi) * sigma_0, rel=0.02)
    one_cell = ProgrammingNoise(1.0, "pcm").apply(
        torch.full((1, 20_000), 2.0, dtype=torch.float64), Crossbar(), torch.Generator().manual_seed(2), SITE
    )
    assert float(one_cell.mean()) < 2 - 0.5 * sigma_0 / math.sqrt(2 * math.pi)  # the empty cell pulls to 0
    signed = ProgrammingNoise(1.0, "pcm_signed").apply(
        levels, Crossbar(), torch.Generator().manual_seed(8), SITE
    )
    assert not torch.allclose(signed, noisy)


def test_pcm_drift_draws_nu_from_the_level_written_to_the_cell_the_weight_sits_on() -> None:
    """As aihwkit: nu from the target conductance, not the programmed one; a weight whose sign programming
    flipped sits on the pair's other cell, written to 0 (nu's clamps: mu 0.1, sigma 0.045)."""
    written = torch.tensor([[255.0, 255.0, -51.0, 3.0]], dtype=torch.float64)
    programmed = torch.tensor([[240.0, 255.0, -60.0, -2.0]], dtype=torch.float64)  # the last flipped sign
    crossbar = Crossbar(drift="pcm", t_inference=86_400.0)
    site = effects.Site(0, "layer", written=written)
    drifted = Drift.configured(crossbar).apply(programmed, crossbar, torch.Generator().manual_seed(4), site)
    normal = torch.randn(programmed.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    g = [1.0, 1.0, 0.2, 1e-7]  # the target of the cell each programmed weight sits on
    mu = torch.tensor(
        [[min(max(-0.0155 * math.log(x) + 0.0244, 0.049), 0.1) for x in g]], dtype=torch.float64
    )
    sigma = torch.tensor(
        [[min(max(-0.0125 * math.log(x) - 0.0059, 0.008), 0.045) for x in g]], dtype=torch.float64
    )
    expected = programmed * ((86_400 + 20) / 20) ** -(mu + sigma * normal).abs()
    assert torch.allclose(drifted, expected, rtol=1e-14, atol=0)
    own = Drift.configured(crossbar).apply(programmed, crossbar, torch.Generator().manual_seed(4), SITE)
    assert not torch.allclose(own, drifted)  # without the written levels: nu from the programmed ones


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
    for image in range(len(x)):  # each image's own generator, drawn tile after tile
        generator = _seeded(f"3/read/{image}")
        for draw in read_effect.drawn:
            assert torch.equal(
                draw[image], torch.randn(draw.shape[1:], generator=generator, dtype=torch.float64)
            )
    # An ideal ADC rounds each tile's partial sums: the offset moves them by its rounding, tile by tile.
    assert not torch.equal(acc, plain)


def test_stuck_cells_hold_the_lowest_or_the_highest_level_where_drawn() -> None:
    """Each cell of the pair (G+ = max(v, 0), G- = max(-v, 0)) is stuck off where u < off and on where
    off <= u < off + on, u one uniform draw per cell, G+ first."""
    levels = torch.tensor([[3.0, -2.0, 0.0], [1.0, 0.0, -3.0]], dtype=torch.float64)
    effect = StuckCells(off=0.2, on=0.3)
    stuck = effect.apply(levels, Crossbar(bits_per_cell=2), torch.Generator().manual_seed(9), SITE)
    u = torch.rand((2, 2, 3), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    expected = torch.zeros_like(levels)
    for index in np.ndindex(*levels.shape):
        pair = [max(float(levels[index]), 0.0), max(-float(levels[index]), 0.0)]
        for cell in (0, 1):
            draw = float(u[(cell, *index)])
            pair[cell] = 0.0 if draw < 0.2 else 3.0 if draw < 0.5 else pair[cell]  # 2-bit cells: top 3
        expected[index] = pair[0] - pair[1]
    assert torch.equal(stuck, expected) and not torch.equal(stuck, levels)
    assert StuckCells.configured(Crossbar(stuck_on=0.01)) == StuckCells(0.0, 0.01)


@pytest.mark.parametrize("model", ["constant", "pcm"])
def test_drift_scales_each_cell_by_the_time_ratio_to_its_own_exponent(model: str) -> None:
    """G(t) = G·((t + t0) / t0)^(-nu); nu = |mu + sigma·n|: constant mu, sigma, or aihwkit's PCM fit of the
    cell's level ĝ = |level| / 255 (mu = clamp(-0.0155 ln ĝ + 0.0244, 0.049, 0.1), sigma = clamp(-0.0125 ln ĝ
    - 0.0059, 0.008, 0.045))."""
    levels = torch.tensor([[255.0, -51.0, 1.0, 0.0]], dtype=torch.float64)
    crossbar = Crossbar(drift=model, t_inference=86_400.0)
    effect = Drift.configured(crossbar)
    drifted = effect.apply(levels, crossbar, torch.Generator().manual_seed(4), SITE)
    normal = torch.randn(levels.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    if model == "constant":
        mu, sigma = torch.full_like(levels, 0.1), torch.full_like(levels, 0.05)
    else:
        g = [1.0, 0.2, 1 / 255, 1e-7]
        mu = torch.tensor(
            [[min(max(-0.0155 * math.log(x) + 0.0244, 0.049), 0.1) for x in g]], dtype=torch.float64
        )
        sigma = torch.tensor(
            [[min(max(-0.0125 * math.log(x) - 0.0059, 0.008), 0.045) for x in g]], dtype=torch.float64
        )
        assert mu[0, 0] == 0.049 and sigma[0, 0] == 0.008 and mu[0, 3] == 0.1  # the clamps
    nu = (mu.double() + sigma.double() * normal).abs()
    expected = levels * ((86_400 + 20) / 20) ** -nu
    assert torch.allclose(drifted, expected, rtol=1e-14, atol=0)
    at_t0 = Drift.configured(Crossbar(drift=model)).apply(levels, crossbar, torch.Generator(), SITE)
    assert torch.equal(at_t0, levels)  # t_inference = 0: the first read, nothing drifted yet


def test_global_drift_compensation_undoes_a_uniform_drift() -> None:
    """With one nu for every cell (drift_nu_std = 0), drift scales every weight by r^-nu, and aihwkit's global
    compensation (the mean |W| right after programming over the mean |W| at t) is r^nu: it brings the
    column sums back to the ideal ones but for the ADC's rounding of the smaller readings (an ideal ADC
    rounds each to an integer: 1/2 per tile and weight slice, times its significance and alpha)."""
    rng = np.random.default_rng(13)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    ideal = Ideal().accumulate(layer, x).double()
    settings = {"rows": 64, "cells_per_weight": 2, "bits_per_cell": 4, "drift": "constant"}
    settings |= {"drift_nu_std": 0.0, "t_inference": 3.15e7}
    drifted = CrossbarArithmetic(Crossbar(**settings)).accumulate(layer, x).double()
    chip = CrossbarArithmetic(Crossbar(**settings, drift_compensation=True))
    compensated = chip.accumulate(layer, x).double()
    alpha = ((3.15e7 + 20) / 20) ** 0.1
    assert chip._compensation["conv"] == pytest.approx(alpha, rel=1e-12)
    rounding = 3 * 0.5 * (1 + 2**4)  # three tiles, two weight slices (shifts 0 and 4)
    assert torch.allclose(compensated, ideal, rtol=0, atol=rounding * alpha + 0.5)
    assert torch.allclose(drifted, ideal / alpha, rtol=0, atol=rounding)
    # a year at nu = 0.1: 0.24 of the conductance is left
    assert float(drifted.abs().sum() / ideal.abs().sum()) == pytest.approx(0.240, abs=0.001)


def test_read_noise_adds_sigma_times_the_cell_range_times_the_inputs_norm() -> None:
    """Partial sum + σ·(2^b - 1)·sqrt(Σ x²)·n over the tile's rows; the crossbar gives each read effect
    that needs it Σ x² over exactly the rows of its tile."""
    values = torch.tensor([[[[10.0]], [[-4.0]]]], dtype=torch.float64)  # (1, 2, 1, 1)
    energy = torch.tensor([[[[9.0]]]], dtype=torch.float64)
    noisy = ReadNoise(0.01).apply(values, Crossbar(), ReadStream(2, 5, 1), Site(0, "c", 0, energy))
    normal = torch.randn((1, 2, 1, 1), generator=_seeded("2/read/5"), dtype=torch.float32)
    assert torch.allclose(noisy, values + 0.01 * 255 * 3 * normal.double(), rtol=1e-15, atol=0)
    rng = np.random.default_rng(14)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    recorded = EnergyRecorder()
    CrossbarArithmetic(Crossbar(rows=64), effects=[recorded]).accumulate(layer, x)
    padded = torch.nn.functional.pad(x.double(), (1, 1, 1, 1)).square()
    rows = torch.zeros(144, dtype=torch.float64)  # 16 channels x 3 x 3 terms in 3 tiles: 48 each
    for tile, energy in enumerate(recorded.energies):
        rows.zero_()
        rows[48 * tile : 48 * (tile + 1)] = 1
        expected = torch.nn.functional.conv2d(padded, rows.reshape(1, 16, 3, 3))
        assert torch.equal(energy, expected)
    assert len(recorded.energies) == 3


@dataclass(frozen=True)
class EnergyRecorder(Effect):
    """A read effect that records the Σ x² the crossbar gives it and changes nothing."""

    energies: list[torch.Tensor] = field(default_factory=list, compare=False)
    step: ClassVar[str] = "read"
    needs_input_energy: ClassVar[bool] = True

    def apply(self, values: torch.Tensor, crossbar: Crossbar, generator: ReadStream, site) -> torch.Tensor:
        self.energies.append(site.input_energy)
        return values


def test_adc_errors_are_fixed_per_adc_and_chip_and_act_before_the_adc_rounds() -> None:
    """In LSB: p/step·(1 + gain) + offset + inl·4f(1 - f) + noise·n; offset and gain drawn per column from
    the site's chip generator (the same in every batch), the noise from the read stream."""
    values = torch.tensor([[[[12.0]], [[-30.0]], [[0.0]]]], dtype=torch.float64)  # three ADCs
    step = torch.tensor([2.0, 4.0, 1.0], dtype=torch.float64).reshape(1, 3, 1, 1)
    low, high = torch.full_like(step, -8.0), torch.full_like(step, 7.0)
    site = Site(5, "conv", 1, adc_step=step, code_min=low, code_max=high)
    effect = AdcErrors(offset=0.5, gain=0.02, inl=0.3, noise=0.1)
    first = effect.apply(values, Crossbar(adc_bits=4), ReadStream(1, 0, 1), site)
    chip = site.chip_generator("adc_errors")
    offset, gain = (
        0.5 * torch.randn(3, generator=chip, dtype=torch.float64),
        0.02 * torch.randn(3, generator=chip, dtype=torch.float64),
    )
    lsb = (values / step) * (1 + gain.reshape(1, 3, 1, 1)) + offset.reshape(1, 3, 1, 1)
    place = ((lsb + 8) / 15).clamp(0, 1)
    noise = torch.randn((1, 3, 1, 1), generator=_seeded("1/read/0"), dtype=torch.float64)
    expected = (lsb + 0.3 * 4 * place * (1 - place) + 0.1 * noise) * step
    assert torch.allclose(first, expected, rtol=1e-14, atol=0)
    again = effect.apply(values, Crossbar(adc_bits=4), ReadStream(1, 7, 1), site)  # another image
    still = AdcErrors(offset=0.5, gain=0.02, inl=0.0, noise=0.0)
    fixed = [still.apply(values, Crossbar(), ReadStream(1, image, 1), site) for image in (1, 2)]
    assert not torch.equal(first, again) and torch.equal(*fixed)  # the noise is per read, the rest fixed
    other_chip = still.apply(
        values, Crossbar(), ReadStream(1, 1, 1), Site(6, "conv", 1, None, step, low, high)
    )
    assert not torch.equal(other_chip, fixed[0])


def test_the_crossbar_hands_its_adcs_to_a_convert_effect_before_they_round() -> None:
    """With ADC offsets on, a 5-bit crossbar reads other codes than without; each reading stays a code of
    its ADC times its step (the errors act at the ADC's input), and the same chip reads the same."""
    rng = np.random.default_rng(15)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    geometry = Geometry(tiles=3, slices=1, outputs=8)  # 144 terms at 64 rows
    steps = {"conv": LayerSteps.symmetric(geometry, "layer", np.array([2.0**10]), 5)}
    clean = CrossbarArithmetic(Crossbar(rows=64, adc_bits=5), adc_steps=steps).accumulate(layer, x)
    crossbar = Crossbar(rows=64, adc_bits=5, adc_offset=2.0)
    offset = [CrossbarArithmetic(crossbar, seed=s, adc_steps=steps).accumulate(layer, x) for s in (0, 0, 1)]
    assert not torch.equal(clean, offset[0]) and torch.all(offset[0] % 2**10 == 0)
    assert torch.equal(offset[0], offset[1]) and not torch.equal(offset[0], offset[2])


def test_bad_settings_of_the_effects_fail_before_any_work() -> None:
    for settings, message in [
        ({"t_inference": 60.0}, "with device.drift=none and device.charge_loss=none: nothing changes"),
        ({"drift_compensation": True}, "with device.drift=none and device.charge_loss=none: nothing"),
        ({"charge_loss": "flash"}, "device.charge_loss='flash': expected one of none, sonos"),
        ({"drift": "constant", "drift_nu_mean": 1.5}, "expected drift exponents in 0..1"),
        ({"drift": "pcm", "drift_nu_mean": 0.2}, "are drift=constant's"),
        ({"drift": "weibull"}, "device.drift='weibull': expected one of none, constant, pcm"),
        ({"drift": "pcm", "t_inference": -1.0}, "device.t_inference=-1.0: expected seconds >= 0"),
        ({"stuck_off": 0.6, "stuck_on": 0.6}, "of at most 1 together"),
        ({"read_noise": -0.1}, "device.read_noise=-0.1: expected a σ >= 0"),
        ({"adc_inl": 0.5}, "device.adc_inl=0.5: an ideal ADC (device.adc_bits=null) has no errors"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            DeviceConfig(kind="cim", **settings)
    noisy = DeviceConfig(kind="cim", adc_bits=4, drift="pcm", t_inference=3600.0, drift_compensation=True)
    assert noisy.noisy and noisy.label == "cim-adc4-pcm-t3600-gdc"
    assert not DeviceConfig(kind="cim", adc_bits=4, adc_inl=0.5).noisy  # INL alone draws nothing


def test_ir_drop_is_aihwkits_first_order_model() -> None:
    """Per tile of n rows and column i: a = n / g_ratio · Σ|w||x| (normalised: top cell level 1, largest
    input 1), c = a(0.05a² - 0.2a + 0.5), y - scale · c · Σ w x (1 - (1 - j/n)²), j the row's place in the
    tile; computed here term by term from the layer's im2col columns."""
    rng = np.random.default_rng(16)
    layer = conv_layer(rng)
    x = centred_input(rng, layer, n=2)
    chip = CrossbarArithmetic(Crossbar(rows=64, ir_drop=0.8, ir_drop_g_ratio=200.0))  # a strong drop
    padded = torch.nn.functional.pad(x.double(), (1, 1, 1, 1))
    columns = torch.nn.functional.unfold(padded, 3)  # (N, 144, 64) in (c, kh, kw) order
    cells = chip.weight_slices(layer)[0][0]  # (8, 144): one 8-bit slice
    tiles, _ = chip.tiled_weights(layer)
    n = 48  # 144 terms at 64 rows: three tiles of 48
    place = 1 - (1 - torch.arange(n, dtype=torch.float64) / n) ** 2
    for tile, (channels, weight) in enumerate(tiles):
        got = chip.read(layer, tile, padded[:, channels].to(weight.dtype), weight).reshape(2, 8, -1)
        xs, w = columns[:, n * tile : n * (tile + 1)], cells[:, n * tile : n * (tile + 1)]
        ideal = torch.einsum("on,bnl->bol", w, xs)
        a = n / 200.0 * torch.einsum("on,bnl->bol", w.abs(), xs.abs()) / (255 * 255)
        c = a * (a * (0.05 * a - 0.2) + 0.5)
        expected = ideal - 0.8 * c * torch.einsum("on,bnl->bol", w * place, xs)
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-9)
        assert (got - ideal).abs().max() > 1  # the drop is there
    with pytest.raises(ValueError, match="the ratio only with an IR drop"):
        DeviceConfig(kind="cim", ir_drop_g_ratio=100.0)


def test_sonos_charge_loss_is_crosssims_drift_fit() -> None:
    """At 1 day (a measured point): I + Σ p_k I^k, then the spread's growth sqrt(σ(1)² - σ(0)²) · n, σ(t) =
    A(t)(1 - exp(-I/B(t))), A, B at 1 day 25.59102, 186.85544 nA; between days the fits are linear, past 5
    extrapolated; nothing moves at t = 0."""
    full, i_max = 127, 0.06 / 35e3 * 1e9
    levels = torch.tensor([[127.0, -64.0, 10.0, 0.0]], dtype=torch.float64)
    crossbar = Crossbar(bits_per_cell=7, charge_loss="sonos", t_inference=86_400.0)
    effect = ChargeLoss.configured(crossbar)
    aged = effect.apply(levels, crossbar, torch.Generator().manual_seed(6), SITE)
    normal = torch.randn((1, 4), generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    p1 = [1.72684e-01, 5.72552e-02, -6.85715e-04, 3.50271e-06, -9.37682e-09, 1.40575e-11, -1.19803e-14,
          5.41293e-18, -8.85448e-22, -1.66869e-25, 5.95180e-29]  # fmt: skip
    expected = []
    for index, level in enumerate(levels[0].tolist()):
        current = abs(level) / full * i_max
        moved = current + sum(p * current**k for k, p in enumerate(p1))
        now = 25.59102 * (1 - math.exp(-moved / 186.85544))
        then = 19.88665 * (1 - math.exp(-current / 176.3115))
        after = max(moved + math.sqrt(max(now**2 - then**2, 0)) * float(normal[0, index]), 0)
        expected.append(math.copysign(after / i_max * full, level) if level else 0.0)
    assert torch.allclose(aged, torch.tensor([expected], dtype=torch.float64), rtol=1e-12, atol=1e-12)
    top_loss = (127 / full * i_max) + sum(p * (i_max**k) for k, p in enumerate(p1)) - i_max
    assert top_loss == pytest.approx(-13.7, abs=0.1)  # the top state loses 0.8 % of Imax in a day
    assert charge_loss.at_day(charge_loss.SPREAD_A, 2.5) == pytest.approx((28.72753 + 31.04318) / 2)
    assert charge_loss.at_day(charge_loss.SPREAD_A, 6.0) == pytest.approx(34.57909 + (34.57909 - 33.76214))
    fresh = ChargeLoss(0.0).apply(levels, crossbar, torch.Generator(), SITE)
    assert torch.equal(fresh, levels)


def test_noisy_cells_are_read_as_exact_fixed_point_digits() -> None:
    """Cells that are not integers are rounded to 2^-16 of a level and cut into digits small enough for an
    exact float32 convolution; the digits add up to the rounded cells exactly."""
    cells = torch.randn(2, 8, 144, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 90
    digits, significance = cell_digits(cells, 9)
    rounded = torch.round(cells * 2.0**CELL_FRACTION_BITS) / 2.0**CELL_FRACTION_BITS
    assert torch.equal((digits * significance.view(-1, 1, 1, 1)).sum(dim=0), rounded)
    assert (rounded - cells).abs().max() <= 2.0 ** -(CELL_FRACTION_BITS + 1)
    assert torch.equal(digits, digits.round()) and digits.abs().max() <= 2**9 - 1
    assert len(significance) == math.ceil((int(cells.abs().max()).bit_length() + CELL_FRACTION_BITS) / 9)


def test_a_drifted_chip_reads_its_rounded_cells_the_same_on_every_kernel(monkeypatch) -> None:
    """A drifted chip's partial sums equal Σ x · (its cells rounded to 2^-16 of a level), computed exactly
    in float64, within float32's rounding of the result; and oneDNN's direct convolution and the im2col
    matrix product (CUDA's path) give the same bits."""
    rng = np.random.default_rng(21)
    layer = conv_layer(rng)
    x = centred_input(rng, layer, n=3)
    settings = {"rows": 64, "drift": "pcm", "t_inference": 86_400.0, "read_noise": 0.01}
    chip = CrossbarArithmetic(Crossbar(**settings), seed=4)
    direct = chip.accumulate(layer, x)
    monkeypatch.setattr(cim, "integer_conv2d", functools.partial(integer_conv2d, gemm=True))
    gemm = CrossbarArithmetic(Crossbar(**settings), seed=4).accumulate(layer, x)
    assert torch.equal(direct, gemm)
    monkeypatch.undo()
    quiet = CrossbarArithmetic(Crossbar(rows=64, drift="pcm", t_inference=86_400.0), seed=4)
    tiles, _ = quiet.tiled_weights(layer)
    cells = torch.stack([cell for cell, _ in quiet.weight_slices(layer)])[0]  # (O, K): one 8-bit slice
    rounded = torch.round(cells * 2.0**CELL_FRACTION_BITS) / 2.0**CELL_FRACTION_BITS
    padded = torch.nn.functional.pad(x.double(), (1, 1, 1, 1))
    columns = torch.nn.functional.unfold(padded, 3)  # (N, 144, 64) in (c, kh, kw) order
    for tile, (channels, weight) in enumerate(tiles):
        got = quiet.read(layer, tile, padded[:, channels].float(), weight).reshape(3, 8, -1)
        terms = slice(48 * tile, 48 * (tile + 1))
        exact = torch.einsum("on,bnl->bol", rounded[:, terms], columns[:, terms])
        size = torch.einsum("on,bnl->bol", rounded[:, terms].abs(), columns[:, terms].abs())
        assert got.dtype == torch.float32
        assert ((got.double() - exact).abs() <= 2.0**-22 * size).all()  # two float32 additions' rounding


def test_an_image_gets_the_same_draws_in_any_batch() -> None:
    """The cells' effects are drawn once per chip, the read noise per image of the run: two batches of 2
    images read what one batch of 4 reads, with read noise too."""
    rng = np.random.default_rng(22)
    layer = conv_layer(rng)
    x = centred_input(rng, layer, n=4)

    def in_batches(settings: dict, size: int) -> torch.Tensor:
        chip = CrossbarArithmetic(Crossbar(rows=64, **settings), seed=3)
        parts = []
        for first in range(0, 4, size):
            chip.start_batch(first, size)
            parts.append(chip.accumulate(layer, x[first : first + size]))
        return torch.cat(parts)

    aged = {"drift": "pcm", "t_inference": 3600.0, "weight_noise": 0.02, "read_noise": 0.01}
    whole = in_batches(aged, 4)
    assert torch.equal(whole, in_batches(aged, 2)) and torch.equal(whole, in_batches(aged, 1))
    assert not torch.equal(whole, in_batches(aged | {"read_noise": 0.02}, 4))  # the noise is there
