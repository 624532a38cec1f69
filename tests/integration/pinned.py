"""Pinned digests (issue 60): the models that must be the same bytes on every CPU kind, and the integer
device's predictions on them, as `resnet8ptq/digests.py` computes them. CI runs on whichever CPU kind its
machine has (an Intel Xeon with AMX, an AVX2-only AMD EPYC, an AMD EPYC with AVX512-VNNI); each check compares
what that machine made with the values below, pinned on one of them, and a mismatch names the digest, the
configuration and the machine. No check runs anything of its own: each reads what a test module already makes.

* `test_model.py`: the canonical FP32 model every run starts from (issue 72);
* `test_kernel_paths.py`: the headline sweep's four models (`make sweep`: ONNX Runtime and PyTorch x int8,
  uint8; MinMax, per tensor), calibrated and quantized on the libraries' own kernel path;
* `test_device.py`: ONNX Runtime int8 per-channel and its integer device (the shared toolchain sweep);
* `test_device_cim.py`: that model on a crossbar of 128 rows with a 4-bit ADC and the default range rule
  (`mse`, per column).

Why these can be the same everywhere: the conversion folds each BatchNorm with a scale computed in float64 and
writes the initializers in name order (resnet8ptq/batchnorm_fold.py, issue 72), ONNX Runtime and PyTorch
calibrate in float64 (docs/backends.md), their weights are quantized by exact IEEE operations, and the integer
device and the crossbar compute in integers (float tensors only where every partial sum is exact:
resnet8ptq/device/executor.py).

Left out, with why (docs/backends.md, "Same model on every CPU"): TFLite's models (its converter calibrates in
its own float32 kernels, which follow the CPU and which no setting reaches); the learned algorithms (AdaRound,
BRECQ, QDrop learn in float32 with torch's CPU kernels); and every reference pass's `digest.predictions`
(ONNX Runtime's and PyTorch's reference passes run the CPU's float32 kernels, so a few predictions move
between CPU kinds while the model stays the same: `python -m resnet8ptq.diff` says "same model, different
reference pass").

A deliberate change of these models (a library in requirements.lock, the conversion recipe, the quantizer)
moves the digests: the failure message gives the new values to pin, after checking that the change is meant.
"""

from __future__ import annotations

from collections.abc import Mapping

from resnet8ptq.hardware import Hardware

CONFIRMED_ON = ("AMD EPYC Zen 3 (avx2,fma; 2 cores), AVX2 only, at 613d717",)
"""The CPU kinds that have made every value below so far, the first of them the one that pinned them, each
with the commit it ran. Not yet confirmed: the Intel Xeon (AVX-512, AMX) and AMD EPYC Zen 4 and Zen 5, whose
first CI run since issue 72 confirms these values (then add it here) or refutes them (its message names what
moved). What the Intel Xeon made at 5413c13 from the same FP32 model (its own conversion, in
shared/cross_cpu/intel_xeon_amx_5413c13/) this Zen 3 made too, to the bit: ranges and models of both
backends (CHANGELOG, issue 72)."""

CONFIGURATIONS = {
    "fp32": "the canonical FP32 model (every run's FP32 baseline; backend=onnx's digest.model)",
    "onnx int8": "backend=onnx dtype=int8 (make sweep)",
    "onnx uint8": "backend=onnx dtype=uint8 (make sweep)",
    "torch int8": "backend=torch dtype=int8 (make sweep)",
    "torch uint8": "backend=torch dtype=uint8 (make sweep)",
    "onnx int8 per-channel": "backend=onnx dtype=int8 per_channel=true device=integer",
    "crossbar": "backend=onnx dtype=int8 per_channel=true device=cim device.rows=128 device.adc_bits=4",
}
"""Each pinned configuration's name, and the command-line settings that make it."""

HEADLINE_ONNX_RANGES = "5921bb8be1e319d1"
"""ONNX Runtime's MinMax ranges of the 1,000 calibration images: the same for int8 and uint8, per tensor or
per channel (the activations' ranges do not depend on the types)."""
TORCH_RANGES = "b38f7ef817b24264"
"""PyTorch's MinMax ranges of the same images: the same for int8 and uint8."""
PER_CHANNEL = {
    "digest.calibration_ranges": HEADLINE_ONNX_RANGES,
    "digest.model": "a32c5b20b8ee360b",
    "digest.integer_model": "d3f5d8f9cf721474",
}
PINNED: dict[str, dict[str, str]] = {
    "fp32": {"digest.model": "aa4c1a645ab37cd8"},
    "onnx int8": {"digest.model": "d0e1daa5b5e44f96", "digest.calibration_ranges": HEADLINE_ONNX_RANGES},
    "onnx uint8": {"digest.model": "aaa033ad8b6cd3d7", "digest.calibration_ranges": HEADLINE_ONNX_RANGES},
    "torch int8": {"digest.model": "71502639d61eeded", "digest.calibration_ranges": TORCH_RANGES},
    "torch uint8": {"digest.model": "b45336d3b39acd99", "digest.calibration_ranges": TORCH_RANGES},
    "onnx int8 per-channel": {**PER_CHANNEL, "digest.device_predictions": "13c21d42476559bb"},
    "crossbar": {**PER_CHANNEL, "digest.device_predictions": "6a736b44f751ae90"},
}
"""Configuration -> digest tag -> its value on every CPU kind."""


def mismatches(configuration: str, found: Mapping[str, str]) -> list[str]:
    """Each pinned digest of ``configuration`` that ``found`` (digest tag -> value) lacks or differs in."""
    return [
        f"{tag} {found.get(tag, 'missing')} (pinned {pinned})"
        for tag, pinned in PINNED[configuration].items()
        if found.get(tag) != pinned
    ]


def check(configuration: str, found: Mapping[str, str], machine: Hardware | None) -> None:
    """Fail, naming the digests that moved, the configuration and the machine, unless ``found`` holds every
    pinned digest of ``configuration``."""
    moved = mismatches(configuration, found)
    if moved:
        where = machine.label if machine else "a machine the run did not record"
        raise AssertionError(
            f"{configuration} ({CONFIGURATIONS[configuration]}) made other digests on {where} than the CPU "
            f"kinds that confirmed them so far ({'; '.join(CONFIRMED_ON)}): {'; '.join(moved)}"
        )
