"""calib=mse: the range search finds the least-error range of a tensor's own integer grid."""

from __future__ import annotations

import numpy as np
import pytest

from resnet8ptq.calibration import CalibConfig, RangeCollector, mse_range
from resnet8ptq.dtype import ort_scale_zero_point


def _collected(values: np.ndarray, symmetric: bool = False) -> RangeCollector:
    collector = RangeCollector(CalibConfig("mse", symmetric=symmetric, num_bins=2048))
    for batch in np.array_split(values.astype(np.float32), 4):
        collector.add(batch)
    return collector


def _quantization_error(values: np.ndarray, low: float, high: float, qrange: tuple[int, int]) -> float:
    """Mean squared error of ``values`` quantized with ORT's formula to ``qrange`` over (low, high)."""
    scale, zero_point = ort_scale_zero_point(low, high, *qrange, symmetric=False)
    integers = np.clip(np.round(values / scale) + zero_point, *qrange)
    return float(np.mean((values - (integers - zero_point) * scale) ** 2))


@pytest.mark.parametrize("bits, sigmas", [(3, 2.15), (4, 2.55)])
def test_gaussian_clipping_matches_the_analytical_optimum(bits: int, sigmas: float) -> None:
    """For a unit Gaussian the MSE-optimal clipping is ~2.15 sigma at 3 bits and ~2.55 at 4 (Banner et al.,
    ACIQ, 2019): the search finds it within 0.1 sigma."""
    values = np.random.default_rng(0).normal(0.0, 1.0, 400_000)
    low, high = _collected(values, symmetric=True).compute((0, 2**bits - 1))
    assert low == -high
    assert high == pytest.approx(sigmas, abs=0.1)


def test_the_range_has_the_least_error_on_the_data_itself() -> None:
    """On ReLU-like data with outliers: no candidate range quantizes the real values with less error (up to
    the histogram's resolution), and the minmax range has almost twice its error at 4 bits."""
    rng = np.random.default_rng(1)
    values = np.maximum(rng.normal(0.0, 1.0, 100_000), 0.0)
    values[:20] = 15.0
    qrange = (0, 15)
    low, high = _collected(values).compute(qrange)
    assert low == 0.0 and 0.0 < high < 15.0
    found = _quantization_error(values, low, high, qrange)
    others = [_quantization_error(values, 0.0, 15.0 * k / 100, qrange) for k in range(1, 101)]
    assert found <= min(others) * 1.01
    assert found < 0.6 * _quantization_error(values, 0.0, 15.0, qrange)


def test_the_range_depends_on_the_grid() -> None:
    """More levels cost less to keep the outliers: the 8-bit range is wider than the 4-bit one."""
    values = np.abs(np.random.default_rng(2).standard_t(3, 100_000))
    collector = _collected(values)
    assert collector.compute((0, 255))[1] > collector.compute((0, 15))[1]


def test_negative_and_positive_ends_are_searched_on_their_own() -> None:
    values = np.concatenate([np.random.default_rng(3).normal(0, 1, 50_000), [-40.0, 40.0]])
    low, high = mse_range(_histogram(values), (-8, 7))
    assert -6.0 < low < -1.0 and 1.0 < high < 6.0


def _histogram(values: np.ndarray) -> tuple:
    threshold = float(np.abs(values).max())
    counts, edges = np.histogram(values, 2048, range=(-threshold, threshold))
    return counts, edges, values.min(), values.max(), threshold


def test_mse_needs_the_integer_range() -> None:
    with pytest.raises(ValueError, match="integer range"):
        _collected(np.arange(12.0)).compute()


def test_mse_needs_a_histogram() -> None:
    with pytest.raises(ValueError, match="num_bins"):
        CalibConfig("mse", num_bins=None)


def test_weight_clipping_has_the_least_error_of_its_candidates() -> None:
    """``calib.weights=mse`` on one heavy-tailed (Laplace) channel at 4 bits, symmetric -7..7: it clips well
    inside the largest weight, and no candidate k/100 of it quantizes the weight with less error."""
    from resnet8ptq.calibration import mse_weight_range

    weight = np.random.default_rng(2).laplace(0.0, 0.05, 2304).astype(np.float32)
    low, high = mse_weight_range(weight, (-7, 7), symmetric=True)
    bound = float(np.abs(weight).max())
    assert low == -high and 0.3 * bound < high < 0.9 * bound

    def error(top: float) -> float:
        scale = 2 * top / 14
        return float(np.mean((weight - np.clip(np.round(weight / scale), -7, 7) * scale) ** 2))

    best = error(high)
    assert all(best <= error(bound * k / 100) + 1e-12 for k in range(1, 101))
    assert best < 0.7 * error(bound)


@pytest.mark.parametrize("per_channel", [True, False])
def test_both_backends_clip_weights_alike(per_channel: bool) -> None:
    """The ONNX backend's grid (:func:`weight_grid`) and the torch weight observer give the same scales and
    zero points with ``calib.weights=mse``, and they differ from min/max's."""
    import torch

    from resnet8ptq.backends.torch.observers import OrtWeightObserver
    from resnet8ptq.dtype import DtypeConfig
    from resnet8ptq.spec import QuantSpec
    from resnet8ptq.weight_grid import weight_grid

    weight = np.random.default_rng(3).laplace(0.0, 0.05, (16, 8, 3, 3)).astype(np.float32)
    dtype = DtypeConfig("uint8", "int8", weight_bits=4)
    grids = {}
    for method in ("minmax", "mse"):
        spec = QuantSpec(dtype, CalibConfig("minmax", weights=method), per_channel=per_channel)
        grids[method] = weight_grid(weight, 0, spec)
        symmetric = dtype.weight_symmetric(per_channel)
        observer = OrtWeightObserver(
            torch.int8, *dtype.weight_range(symmetric), symmetric, per_channel, 0, method=method
        )
        observer(torch.from_numpy(weight))
        scales, zero_points = observer.calculate_qparams()
        count = 16 if per_channel else 1
        np.testing.assert_array_equal(scales.numpy()[:count], grids[method].scale)
        np.testing.assert_array_equal(zero_points.numpy()[:count], grids[method].zero_point)
    assert np.all(grids["mse"].scale < grids["minmax"].scale)


def test_bad_weight_method_is_refused() -> None:
    with pytest.raises(ValueError, match=r"calib\.weights=.entropy.: expected one of minmax, mse"):
        CalibConfig("minmax", weights="entropy")
