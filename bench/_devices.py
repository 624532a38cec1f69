"""The devices the speed benches time (bench/device.py on this CPU, bench/device_cuda.py on a GPU), each
with the test images it is timed on."""

from __future__ import annotations

from resnet8ptq.device.config import DeviceConfig

DEVICES = {
    "integer": (DeviceConfig(kind="integer"), 10_000),
    "cim rows=128 adc=4": (DeviceConfig(kind="cim", rows=128, adc_bits=4), 10_000),
    "cim rows=128 adc=8 dac=1 4x2": (
        DeviceConfig(kind="cim", rows=128, adc_bits=8, dac_bits=1, bits_per_cell=4, cells_per_weight=2),
        1_000,
    ),
    "cim noise 0.02 x5 draws": (DeviceConfig(kind="cim", weight_noise=0.02, noise_seeds=5), 10_000),
    "cim rows=128 adc=4 aged x1": (  # issue 43's target: at most 2x the same crossbar without the effects
        DeviceConfig(
            kind="cim",
            rows=128,
            adc_bits=4,
            drift="pcm",
            t_inference=86_400.0,
            drift_compensation=True,
            read_noise=0.01,
            noise_seeds=1,
        ),
        2_000,
    ),
}
"""Each device and the test images it is timed on."""
