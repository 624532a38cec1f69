"""The block reconstructions' activation quantizer (``brecq``/``qdrop``): what it learns is what the
backends store, it quantizes as ONNX Runtime's QuantizeLinear/DequantizeLinear do, QDrop's drop keeps
elements in float at its rate, and its step learns through the straight-through gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resnet8ptq.dtype import ort_scale_zero_point
from resnet8ptq.simulation import LearnedStep


@pytest.mark.parametrize(
    ("low", "high", "qrange"),
    [(0.0, 6.3, (0, 15)), (-1.7, 4.1, (0, 15)), (0.0, 250.0, (0, 255)), (-3.2, 2.9, (-8, 7))],
)
@pytest.mark.parametrize("ratio", [0.61, 1.0, 1.37])
def test_the_learned_range_gives_back_the_learned_scale_and_zero_point(low, high, qrange, ratio) -> None:
    step = LearnedStep(low, high, qrange)
    with torch.no_grad():
        step.ratio.fill_(ratio)
    zero_point = step.zero_point
    learned = step.learned_range()
    scale, again = ort_scale_zero_point(*learned, *qrange, symmetric=False)
    assert again == zero_point
    assert np.float32(scale) == np.float32(step.scale().item())
    initial, _ = ort_scale_zero_point(low, high, *qrange, symmetric=False)
    assert scale == pytest.approx(initial * ratio, rel=1e-6)


def test_it_quantizes_as_quantize_dequantize_linear() -> None:
    """round half to even, add the zero point, clip to the range, then back to float."""
    step = LearnedStep(-1.0, 3.0, (0, 15))
    step.freeze()
    x = torch.linspace(-2, 5, 1001)
    scale, zero_point = float(step.scale()), step.zero_point
    expected = (np.clip(np.round(x.numpy() / np.float32(scale)) + zero_point, 0, 15) - zero_point) * scale
    np.testing.assert_allclose(step(x).detach().numpy(), expected, rtol=1e-6, atol=1e-7)
    assert len(np.unique(step(x).detach().numpy())) == 16


def test_qdrop_keeps_elements_in_float_at_its_rate() -> None:
    torch.manual_seed(0)
    step = LearnedStep(0.0, 1.0, (0, 15))
    x = torch.rand(100_000)
    quantized = step(x)
    step.drop_prob = 0.5
    dropped = step(x)
    kept_float = (dropped == x) & (quantized != x)
    assert abs(kept_float.float().sum().item() / (quantized != x).sum().item() - 0.5) < 0.01


def test_the_step_learns_through_the_straight_through_gradient() -> None:
    """Values spread to 4: a step calibrated on [0, 1] saturates them, so the error shrinks as it grows."""
    step = LearnedStep(0.0, 1.0, (0, 15))
    x = torch.rand(10_000) * 4
    optimizer = torch.optim.Adam([step.ratio], lr=0.05)
    before = torch.mean((step(x) - x) ** 2).item()
    for _ in range(100):
        loss = torch.mean((step(x) - x) ** 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert step.ratio.item() > 2
    assert torch.mean((step(x) - x) ** 2).item() < before / 4
    step.freeze()
    assert not step.ratio.requires_grad


@pytest.mark.parametrize("per_channel", [True, False])
def test_the_range_ends_keep_their_rounding_so_the_backends_find_the_same_grid(per_channel: bool) -> None:
    """Every element rounded the other way than nearest (the most any learning can do): the elements that
    set each channel's range still round to nearest, and the grid computed again from the learned weights,
    as ONNX Runtime and PyTorch compute it, is the same grid and gives back the same integers. (Symmetric
    weights: an asymmetric grid's ends are not on the grid, so computing it again moves it even under nearest
    rounding.)"""
    from resnet8ptq.algorithms._rounding import SoftRounding
    from resnet8ptq.calibration import CalibConfig
    from resnet8ptq.dtype import DtypeConfig
    from resnet8ptq.spec import QuantSpec
    from resnet8ptq.weight_grid import weight_grid

    spec = QuantSpec(DtypeConfig("uint8", "int8"), CalibConfig("minmax"), per_channel=per_channel)
    weight = np.random.default_rng(5).normal(0, 0.1, (6, 4, 3, 3)).astype(np.float32)
    weight[1, 0, 0, 0] = -0.5  # a channel whose range is set by its negative end
    grid = weight_grid(weight, 0, spec)
    rounding = SoftRounding(weight, grid)
    with torch.no_grad():
        rounding.v.copy_(torch.where(rounding.nearest > 0, -10.0, 10.0))  # every element the other way
    rounding.hard = True
    integers = rounding.integers()
    nearest = grid.quantize(weight)
    assert np.mean(integers != nearest) > 0.9
    learned = grid.dequantize(integers)
    again = weight_grid(learned, 0, spec)
    np.testing.assert_array_equal(again.scale, grid.scale)
    np.testing.assert_array_equal(again.zero_point, grid.zero_point)
    np.testing.assert_array_equal(again.quantize(learned), integers)
