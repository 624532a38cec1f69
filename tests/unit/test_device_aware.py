"""Device-aware learning's crossbar (resnet8ptq/algorithms/_crossbar.py) against the device's own arithmetic
(resnet8ptq/device/cim.py): on the same integers, the differentiable layer's row tiles and ADC readings give
exactly the crossbar model's accumulators; its ADC steps get gradients and stay powers of two (or fixed
point); the learned steps find their layer by its weights, and other weights are refused."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from resnet8ptq.algorithms._crossbar import CrossbarLayer, calibrate
from resnet8ptq.device.adc import LayerSteps
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.evaluate import learned_steps
from resnet8ptq.device.graph import Conv, IntegerModel, Quant
from resnet8ptq.simulation import LearnedStep
from tests.unit.test_device import centred_input, conv_layer

pytestmark = pytest.mark.device


def learning_layer(layer, crossbar: Crossbar, dense: bool = False, seed: int = 0) -> CrossbarLayer:
    """``layer``'s integers as the simulation holds them: unit scales, so that the float output is the
    accumulator itself, no bias."""
    weight = torch.from_numpy(layer.centered_weight.astype(np.float32))
    if dense:
        module = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        weight = weight.reshape(len(weight), -1)
    else:
        module = torch.nn.Conv2d(weight.shape[1], weight.shape[0], 3, padding=1, bias=False)
    module.weight = torch.nn.Parameter(weight)
    rounding = SimpleNamespace(scale=torch.ones(len(weight)))
    unit_input = LearnedStep(-128.0, 127.0, (-128, 127))  # ORT's scale of (-128, 127) on int8: 1
    assert float(unit_input.scale().detach()) == 1.0
    return CrossbarLayer("conv", module, rounding, unit_input, crossbar, seed)


def calibrated(seed: int, crossbar: Crossbar) -> tuple[Conv, CrossbarLayer, torch.Tensor]:
    """A random conv layer, its learning crossbar with the ADCs calibrated (``mse``) on one batch of inputs,
    and another batch."""
    rng = np.random.default_rng(seed)
    layer = conv_layer(rng)
    learning = learning_layer(layer, crossbar)
    calibration, x = centred_input(rng, layer, 8), centred_input(rng, layer)
    calibrate([learning], lambda: learning(calibration), crossbar)
    return layer, learning, x


@pytest.mark.parametrize(
    "crossbar",
    [
        Crossbar(rows=32, adc_bits=4),
        Crossbar(rows=50, adc_bits=3, adc_granularity="tile", adc_window="symmetric"),
        Crossbar(rows=32, adc_bits=5, adc_step="free", adc_granularity="layer"),
    ],
    ids=["column-pow2", "tile-symmetric", "layer-free"],
)
def test_the_learning_crossbar_reads_what_the_device_reads(crossbar: Crossbar) -> None:
    """Calibrated (``mse``) on a batch, then run on another: the same accumulators as the device model
    with the same steps, to the bit, and not the exact ones (the ADC is coarse)."""
    layer, learning, x = calibrated(11, crossbar)
    device = CrossbarArithmetic(crossbar, adc_steps={"conv": learning.learned("")})
    expected = device.accumulate(layer, x)
    with torch.no_grad():
        got = learning(x).double()
    if crossbar.adc_step == "pow2":
        assert torch.equal(got, expected.double())
    else:  # fixed-point steps: the device sums in float64, the learning in float32 (see _crossbar)
        assert torch.max(torch.abs(got - expected)) <= 1 and torch.mean((got == expected).double()) > 0.99
    assert not torch.equal(got, CrossbarArithmetic(Crossbar()).accumulate(layer, x).double())


def test_a_dense_layer_reads_its_single_tile() -> None:
    rng = np.random.default_rng(12)
    base = conv_layer(rng, channels_in=64, channels_out=10)
    layer = dataclasses.replace(base, weight=base.weight[:, :, :1, :1], padding=(0, 0, 0, 0), dense=True)
    crossbar = Crossbar(rows=128, adc_bits=4)
    learning = learning_layer(layer, crossbar, dense=True)
    x = torch.from_numpy(rng.integers(0, 256, (16, 64, 1, 1)).astype(np.float32))
    calibrate([learning], lambda: learning(x.reshape(16, 64)), crossbar)
    device = CrossbarArithmetic(crossbar, adc_steps={"conv": learning.learned("")})
    with torch.no_grad():
        got = learning(x.reshape(16, 64)).double()
    assert torch.equal(got, device.accumulate(layer, x).double().reshape(16, 10))


@pytest.mark.parametrize("step", ["pow2", "free"])
def test_the_adc_steps_learn_and_stay_on_the_device_grid(step: str) -> None:
    """The straight-through ADC passes gradients to its steps, the weights and the input's step; after a
    few Adam steps towards a target the steps are still powers of two (or multiples of 2^-8), at least 1."""
    rng = np.random.default_rng(13)
    layer = conv_layer(rng)
    crossbar = Crossbar(rows=32, adc_bits=4, adc_step=step)
    learning = learning_layer(layer, crossbar)
    x = centred_input(rng, layer)
    calibrate([learning], lambda: learning(x), crossbar)
    target = CrossbarArithmetic(Crossbar()).accumulate(layer, x).float()
    optimizer = torch.optim.Adam([learning.log_step], lr=0.05)
    before = learning.steps().detach().clone()
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(learning(x), target)
        optimizer.zero_grad()
        loss.backward()
        assert learning.log_step.grad is not None and torch.any(learning.log_step.grad != 0)
        assert learning.layer.weight.grad is not None and torch.any(learning.layer.weight.grad != 0)
        optimizer.step()
    after = learning.steps().detach()
    assert not torch.equal(before, after)
    assert torch.all(after >= 1)
    grid = torch.log2(after) if step == "pow2" else after * 256
    assert torch.equal(grid, torch.round(grid))
    learning.freeze()
    assert torch.equal(learning.steps(), after) and not learning.log_step.requires_grad


def test_learned_steps_find_their_layer_by_its_weights() -> None:
    rng = np.random.default_rng(14)
    first = dataclasses.replace(conv_layer(rng), name="backend_name_1")
    second = dataclasses.replace(conv_layer(rng), name="backend_name_2", input="y", output="z")
    model = IntegerModel("test", "x", Quant(1.0, -128, -128, 127), "half_to_even", [first, second])
    device = DeviceConfig(kind="cim", rows=128, adc_bits=4, adc_range="learned")
    layout = CrossbarArithmetic(device.crossbar())

    def steps(layer, value: float) -> LayerSteps:
        geometry = layout.geometry(layer)
        n = geometry.columns
        code_min = np.full(n, -7, np.int64)
        return LayerSteps(geometry, "column", np.full(n, value), code_min, code_min + 15, layer.weight_key)

    learned = {"fp32_b": steps(second, 4.0), "fp32_a": steps(first, 2.0)}  # another order, other names
    found = learned_steps(model, device, learned)
    assert found["backend_name_1"].steps[0] == 2.0 and found["backend_name_2"].steps[0] == 4.0
    other_weights = dataclasses.replace(second, weight=second.weight + 1)
    with pytest.raises(ValueError, match="no ADC steps were learned for layer backend_name_2's weights"):
        learned_steps(dataclasses.replace(model, layers=[first, other_weights]), device, learned)
    with pytest.raises(ValueError, match="do not fit layer backend_name_1 on this crossbar"):
        learned_steps(model, dataclasses.replace(device, rows=64), learned)
    record = LayerSteps.from_record(learned["fp32_a"].to_record())
    assert record.layer_key == first.weight_key and np.array_equal(record.steps, learned["fp32_a"].steps)


NOISY = Crossbar(
    rows=32, adc_bits=5, weight_noise=0.01, stuck_off=0.01, drift="pcm", t_inference=3600,
    drift_compensation=True,
)  # fmt: skip


def test_a_noisy_chip_is_drawn_as_the_device_draws_it() -> None:
    """On noisy chips (``algo.device_noise``) the learning crossbar draws its cells with the device's own
    effects, in the device's order (programming noise, stuck cells, then drift) and compensates the drift
    as the device does: from the same generator it reads what the device model's chip of that seed reads
    (within the device's fixed-point cells: a reading may round the other way), and not the ideal chip."""
    layer, learning, x = calibrated(15, NOISY)
    steps = learning.learned("")
    device = CrossbarArithmetic(
        NOISY, seed=3, adc_steps={"conv": steps}, effects=learning.program + learning.perturb
    )
    expected = device.accumulate(layer, x).double()
    learning.noisy, learning.chips = True, torch.Generator().manual_seed(3)
    with torch.no_grad():
        got = learning(x).double()
    assert torch.mean((got == expected).double()) > 0.99
    assert torch.max(torch.abs(got - expected)) <= float(steps.steps.max()) * 2  # one code, compensated
    learning.noisy = False
    with torch.no_grad():
        ideal = learning(x).double()
    assert torch.mean((ideal == expected).double()) < 0.5


def test_every_iteration_learns_on_a_new_chip_from_the_calibration_seed() -> None:
    """While noisy, each forward pass draws another chip (the layer's generator, seeded from the seed and
    its name: the same draws for the same seed, others for another); the gradient reaches the weights."""
    rng = np.random.default_rng(16)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)

    def outputs(seed: int) -> list[torch.Tensor]:
        learning = learning_layer(layer, NOISY, seed=seed)
        calibrate([learning], lambda: learning(x), NOISY)
        learning.noisy = True
        first = learning(x)
        first.sum().backward()
        assert learning.layer.weight.grad is not None and torch.any(learning.layer.weight.grad != 0)
        return [first.detach(), learning(x).detach()]

    first, second = outputs(0)
    assert not torch.equal(first, second)
    assert all(torch.equal(a, b) for a, b in zip(outputs(0), (first, second), strict=True))
    assert not torch.equal(outputs(1)[0], first)
