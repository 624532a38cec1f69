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
}
"""Each device and the test images it is timed on."""
