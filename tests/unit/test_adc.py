"""ADC ranges (resnet8ptq/device/adc.py, adc_ranges.py): the profile of partial sums, the range rules (max,
percentile, mse, worst case, granular) per layer, tile or column, symmetric and asymmetric windows,
power-of-two and free steps, and the crossbar reading with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resnet8ptq.device.adc import (
    BINS,
    STEP_FRACTION_BITS,
    Geometry,
    LayerSteps,
    PartialSumProfile,
    adc_table,
    adc_top,
    codes,
    cover,
    magnitude_edges,
    signed_bin,
    signed_edges,
)
from resnet8ptq.device.adc_ranges import (
    AdcError,
    AdcRule,
    calibrated_steps,
    least_error,
    magnitude_percentile,
    percentile_range,
)
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.executor import Ideal
from resnet8ptq.tracking.identity import config_hash
from tests.unit.test_device import centred_input, conv_layer

pytestmark = pytest.mark.device


def exact_error(values: np.ndarray, step: float, first: int, last: int) -> float:
    """The ADC's squared error summed over ``values``, computed value by value."""
    read = np.clip(np.round(values / step), first, last) * step
    return float(((read - values) ** 2).sum())


def profile_of(values: np.ndarray, geometry: Geometry | None = None) -> PartialSumProfile:
    """A profile of integer ``values`` (one column unless ``geometry`` says otherwise)."""
    geometry = geometry or Geometry(1, 1, 1)
    profile = PartialSumProfile()
    partial = torch.from_numpy(values.astype(np.float32)).reshape(-1, geometry.columns, 1, 1)
    profile.add("layer", geometry, partial)
    return profile


def skewed(seed: int = 0, n: int = 200_000) -> np.ndarray:
    """Integer partial sums as a crossbar column gives them: heavy-tailed, mostly positive."""
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_t(3, n) * 2_000 + 3_000)


def test_bins_are_exact_below_1024_and_cover_each_value() -> None:
    values = torch.tensor([-3e7, -5_000, -1025, -1023, -1, 0.0, 1, 1023, 1024, 1025, 5_000, 3e7, 2.0**30])
    index = signed_bin(values).numpy()
    low, high = signed_edges()
    assert np.all(np.diff(index) >= 0) and index.min() >= 0 and index.max() < 2 * BINS
    assert np.all(low[index] <= values.numpy()) and np.all(values.numpy() <= high[index])
    exact = np.abs(values.numpy()) < 1024
    assert np.all(low[index][exact] == values.numpy()[exact])  # one bin per integer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_sum_falls_in_its_bin_in_either_float_type(dtype: torch.dtype) -> None:
    """Sums across the 30 octaves (and the bins' edges, -0.0, beyond 2^40) land in the bin whose edges hold
    them; the exact shortcut agrees below 2^10."""
    rng = np.random.default_rng(0)
    magnitudes = np.floor(np.exp2(rng.uniform(0, 40, 100_000)))
    edges = np.concatenate([magnitude_edges()[0], magnitude_edges()[1]])
    values = np.concatenate([magnitudes, -magnitudes, edges, -edges[edges > 0], [0.0, -0.0]])
    values = values[np.abs(values) < 2.0**40]
    index = signed_bin(torch.tensor(values, dtype=dtype)).numpy()
    low, high = signed_edges()
    assert np.all(low[index] <= values) and np.all(values <= high[index])
    assert signed_bin(torch.tensor([-0.0, 2.0**45, -(2.0**45)], dtype=dtype)).tolist() == [
        BINS,
        2 * BINS - 1,
        0,
    ]
    small = torch.tensor(values[np.abs(values) < 1024], dtype=dtype)
    assert torch.equal(signed_bin(small, exact=True), signed_bin(small))


def test_percentiles_are_exact_on_integer_bins() -> None:
    values = np.arange(-500.0, 500.0)  # -500..499 once each
    low, high, counts = profile_of(values).grouped("layer", "layer")
    assert (low[0], high[0]) == (-500, 499)
    lower, upper = percentile_range(low, high, counts, 99.0)
    assert (lower[0], upper[0]) == (-490, 489)  # 10 of the 1,000 values below, 10 above
    assert magnitude_percentile(np.array([500.0]), counts, 99.0)[0] == 495  # |v|: 0, 1, 1, 2, 2, ...
    assert tuple(percentile_range(low, high, counts, 100.0)) == (low, high)


def test_percentile_above_1024_is_within_a_bin() -> None:
    values = skewed()
    low, high, counts = profile_of(values).grouped("layer", "layer")
    lower, upper = percentile_range(low, high, counts, 99.9)
    for found, exact in ((upper[0], np.percentile(values, 99.9)), (lower[0], np.percentile(values, 0.1))):
        assert abs(found - exact) <= abs(exact) / 64 + 1


@pytest.mark.parametrize(("adc_bits", "window"), [(4, "symmetric"), (4, "asymmetric"), (6, "asymmetric")])
def test_the_histogram_error_is_the_exact_error(adc_bits: int, window: str) -> None:
    values = skewed(1)
    low, high, counts = profile_of(values).grouped("layer", "layer")
    error = AdcError(counts[0], adc_bits, window)
    for step in (1.0, 37.0, (high[0] - low[0]) / codes(adc_bits, window), 5_000.0):
        estimate, _, first = error.at(step, low[0], high[0])
        exact = exact_error(values, step, first, first + codes(adc_bits, window))
        assert estimate == pytest.approx(exact, rel=0.03)


@pytest.mark.parametrize("window", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("step", ["pow2", "free"])
def test_mse_clips_the_tails_and_beats_max(step: str, window: str) -> None:
    """On heavy-tailed sums the least-error ADC clips: its true error is far below the max rule's, and no
    other step or window position nearby does better (checked value by value)."""
    values = skewed(2)
    low, high, counts = profile_of(values).grouped("layer", "layer")
    k = codes(4, window)
    chosen, first = least_error(counts[0], low[0], high[0], AdcRule(4, "mse", "layer", window, step, 99.99))
    best = exact_error(values, chosen, first, first + k)
    widest = calibrated_steps(profile_of(values), AdcRule(4, "max", "layer", window, step, 99.99))["layer"]
    assert best < exact_error(values, widest.steps[0], widest.code_min[0], widest.code_max[0]) / 4
    factors = (0.5, 2.0) if step == "pow2" else (0.8, 0.9, 1.1, 1.25)
    for other in (chosen * f for f in factors):
        assert best <= exact_error(values, other, first, first + k) * 1.03
    if window == "asymmetric":
        for shift in (-3, -1, 1, 3):
            assert best <= exact_error(values, chosen, first + shift, first + shift + k) * 1.03


def test_an_asymmetric_window_spends_its_codes_where_the_sums_are() -> None:
    values = np.round(np.random.default_rng(3).gamma(2.0, 1_500.0, 200_000) - 500)  # mostly positive
    errors = {}
    for window in ("symmetric", "asymmetric"):
        adc = calibrated_steps(profile_of(values), AdcRule(4, "mse", "layer", window, "free", 99.99))["layer"]
        errors[window] = exact_error(values, adc.steps[0], adc.code_min[0], adc.code_max[0])
        assert adc.code_max[0] - adc.code_min[0] == codes(4, window)
    assert errors["asymmetric"] < errors["symmetric"] / 2


def test_power_of_two_steps_cover_the_range() -> None:
    steps = cover(np.array([10.0, 14, 16, 200_000]), 4, "symmetric", "pow2")  # 14 steps: ±7
    assert list(steps) == [1, 1, 2, 2**14]
    assert 14 * steps[-1] >= 200_000 > 14 * steps[-1] / 2


def test_free_steps_are_fixed_point_and_at_least_one_unit() -> None:
    steps = cover(np.array([3.0, 100.0, 123_456.0]), 4, "asymmetric", "free")  # 15 steps
    unit = 2.0**STEP_FRACTION_BITS
    assert np.all(steps * unit == np.round(steps * unit))
    assert steps[0] == 1.0  # a range below 15 units: the ADC reads every unit
    assert steps[1:] == pytest.approx(np.array([100.0, 123_456.0]) / 15, abs=0.5 / unit)


def test_granularity_groups_columns() -> None:
    """Partial sums are laid out tile-major, then cell slice, then output: per tile the ranges are those of
    its columns; per column each column keeps its own."""
    geometry = Geometry(tiles=2, slices=1, outputs=3)
    values = np.array([[1, 2, 3, 40, 50, 600]] * 4, dtype=np.float64)  # (images, columns)
    profile = profile_of(values, geometry)
    assert list(profile.grouped("layer", "layer")[1]) == [600]
    assert list(profile.grouped("layer", "tile")[1]) == [3, 600]
    assert list(profile.grouped("layer", "column")[1]) == [1, 2, 3, 40, 50, 600]
    steps = calibrated_steps(profile, AdcRule(4, "max", "tile", "symmetric", "pow2", 99.99))["layer"]
    assert list(steps.per_column(steps.steps)) == [1, 1, 1, 128, 128, 128]  # 600 / 7 -> 2^7
    columns = calibrated_steps(profile, AdcRule(4, "max", "column", "symmetric", "pow2", 99.99))["layer"]
    table = adc_table({"layer": columns})
    assert list(table.columns) == ["layer", "granularity", "group", "tile", "cell_slice", "column",
                                   "adc_step", "code_min", "code_max", "range_low", "range_high"]  # fmt: skip
    assert list(table["tile"]) == [0, 0, 0, 1, 1, 1] and list(table["column"]) == [0, 1, 2, 0, 1, 2]


def test_a_column_range_reads_each_column_in_its_own_steps() -> None:
    rng = np.random.default_rng(5)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    crossbar = Crossbar(rows=64, adc_bits=5, adc_granularity="column")
    arithmetic = CrossbarArithmetic(crossbar.ideal())
    geometry = arithmetic.geometry(layer)
    assert geometry == Geometry(tiles=3, slices=1, outputs=8)  # 144 terms at 64 rows: 48 + 48 + 48
    steps = np.exp2(np.arange(geometry.columns) % 4)  # 1, 2, 4, 8, ...
    read = CrossbarArithmetic(
        crossbar, adc_steps={"conv": LayerSteps.symmetric(geometry, "column", steps, 5)}
    )
    per_tile = geometry.slices * geometry.outputs
    partial = torch.arange(-200.0, 200.0).reshape(1, 1, -1, 1).expand(1, per_tile, -1, 1)
    for tile in range(geometry.tiles):
        reading = read.adc(layer, tile, partial.clone())
        tile_steps = steps[tile * per_tile : (tile + 1) * per_tile]
        codes = reading / torch.from_numpy(tile_steps).reshape(1, -1, 1, 1).float()
        assert torch.equal(codes, torch.round(codes)) and codes.abs().max() == adc_top(5)
        assert torch.equal(codes[0, :, 0, 0], torch.full((per_tile,), -float(adc_top(5))))  # clipped
        assert torch.equal(codes[0, :, 200, 0], torch.zeros(per_tile))  # p = 0 reads 0
    assert read.adc_bound(layer, 200.0) == (adc_top(5) * 8.0, True)
    assert read.accumulate(layer, x).shape == Ideal().accumulate(layer, x).shape


def test_free_steps_give_integer_accumulators() -> None:
    """One tile, one slice: the accumulator is the ADC code times its fixed-point step, rounded once, half to
    even, to an integer."""
    rng = np.random.default_rng(6)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    ideal = Ideal().accumulate(layer, x).double()
    crossbar = Crossbar(adc_bits=6, adc_step="free")
    geometry = CrossbarArithmetic(crossbar.ideal()).geometry(layer)
    step = cover(np.array([1.6 * float(ideal.abs().max())]), 6, "symmetric", "free")
    assert step[0] != np.round(step[0])  # a step between integers
    adcs = {"conv": LayerSteps.symmetric(geometry, "layer", step, 6)}
    acc = CrossbarArithmetic(crossbar, adc_steps=adcs).accumulate(layer, x)
    top = adc_top(6)
    expected = torch.round(torch.round(ideal / step[0]).clamp(-top, top) * step[0])
    assert torch.equal(acc, expected) and torch.equal(acc, torch.round(acc))
    assert not torch.equal(acc, ideal)


def test_a_granular_adc_with_enough_bits_is_exact() -> None:
    """Steps of one unit and a full scale above every sum: the crossbar equals the integer device."""
    rng = np.random.default_rng(7)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    crossbar = Crossbar(rows=32, adc_bits=24, adc_range="granular", adc_granularity="column")
    geometry = CrossbarArithmetic(crossbar.ideal()).geometry(layer)
    steps = LayerSteps.symmetric(geometry, "column", np.ones(geometry.columns), 24)
    acc = CrossbarArithmetic(crossbar, adc_steps={"conv": steps}).accumulate(layer, x)
    assert torch.equal(acc, Ideal().accumulate(layer, x).double())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"adc_range": "median"}, "device.adc_range='median': expected one of max, percentile, mse"),
        ({"adc_range": "percentile", "adc_percentile": 0.0}, "device.adc_percentile=0.0: expected"),
        ({"adc_range": "percentile", "adc_percentile": 100.5}, "device.adc_percentile=100.5: expected"),
        ({"adc_range": "mse", "adc_percentile": 99.0}, "applies to device.adc_range=percentile only"),
        ({"adc_granularity": "row"}, "device.adc_granularity='row'"),
        ({"adc_step": "log"}, "device.adc_step='log'"),
        ({"adc_window": "offset"}, "device.adc_window='offset'"),
    ],
)
def test_bad_adc_settings_fail_with_the_setting_named(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        DeviceConfig(kind="cim", adc_bits=4, **settings)
    with pytest.raises(ValueError, match="with device=integer"):
        DeviceConfig(kind="integer", adc_granularity="layer")


def test_calibrated_is_max_under_its_old_name() -> None:
    """The earlier name of the max rule runs as max and keeps the earlier runs' config_hash."""
    assert DeviceConfig(kind="cim", adc_bits=4, adc_range="calibrated").range_rule == "max"
    base = {"device": "cim", "device.kind": "cim", "device.adc_bits": 4, "device.adc_granularity": "layer",
            "device.adc_window": "symmetric"}  # fmt: skip
    hashes = {config_hash(base | extra, {}) for extra in ({}, {"device.adc_range": "calibrated"},
                                                          {"device.adc_range": "max"})}  # fmt: skip
    assert len(hashes) == 1
    assert config_hash(base | {"device.adc_range": "mse"}, {}) not in hashes


def test_labels_name_the_adc_range_when_not_the_default() -> None:
    """The default ADC (mse, per column, asymmetric, power-of-two steps) is unnamed; others are named."""
    assert DeviceConfig(kind="cim", rows=128, adc_bits=4).label == "cim-r128-adc4"
    old = DeviceConfig(kind="cim", rows=128, adc_bits=4, adc_range="calibrated", adc_granularity="layer",
                       adc_window="symmetric")  # fmt: skip
    assert old.label == "cim-r128-adc4-max-layer-sym"
    label = DeviceConfig(
        kind="cim", rows=128, adc_bits=4, adc_range="percentile", adc_percentile=99.9, adc_granularity="tile",
        adc_step="free",
    ).label  # fmt: skip
    assert label == "cim-r128-adc4-p99.9-tile-free"
    assert DeviceConfig(kind="cim", rows=64, adc_bits=6, adc_range="worst_case").label == "cim-r64-adc6-wc"


def test_the_calibration_crossbar_keeps_the_layout_and_nothing_else() -> None:
    """Calibration runs on the same tiles and slices with an exact ADC and no noise; crossbars that differ
    only in their ADC or noise calibrate on the same ideal crossbar (one profile in a sweep)."""
    noisy = Crossbar(rows=64, adc_bits=4, adc_range="max", dac_bits=2, bits_per_cell=4, cells_per_weight=2,
                     weight_noise=0.05, accumulator_bits=20)  # fmt: skip
    ideal = noisy.ideal()
    assert (ideal.rows, ideal.dac_bits, ideal.bits_per_cell, ideal.cells_per_weight) == (64, 2, 4, 2)
    assert (ideal.adc_bits, ideal.weight_noise, ideal.accumulator_bits) == (None, 0.0, 32)
    assert Crossbar(rows=64, adc_bits=6, adc_granularity="layer", dac_bits=2, bits_per_cell=4,
                    cells_per_weight=2).ideal() == ideal  # fmt: skip
