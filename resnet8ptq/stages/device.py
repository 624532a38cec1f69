"""Stage ``device`` (`device` != none): the saved model's integer form run as the device computes, every
test image, the ADC ranges from the run's calibration sample."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from resnet8ptq import records
from resnet8ptq.backends.base import Backend
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.inputs import RunInputs
from resnet8ptq.resolve import Plan
from resnet8ptq.stages import RunRecord, Stage

log = logging.getLogger(__name__)


class DeviceStage(Stage):
    name = "device"
    order = 40

    def enabled(self, plan: Plan) -> bool:
        return plan.device.enabled

    def run(self, inputs: RunInputs, record: RunRecord) -> records.OnDevice | None:
        made = record["quantize"].made
        plan = record.plan
        predictions = made.result.reference.predictions
        return on_device(
            plan.device, plan.backend, made.quantized.path, inputs, predictions, plan.name, made.adc_profiles
        )

    def log(self, inputs: RunInputs, record: RunRecord, result: records.OnDevice) -> None:
        reference = record["quantize"].made.result.reference.predictions
        records.log_device(record["fp32"].context, record.run_id, result, reference)


STAGE = DeviceStage()


def on_device(
    device: DeviceConfig,
    backend: Backend,
    path: Path,
    inputs: RunInputs,
    reference_predictions: np.ndarray,
    name: str,
    adc_profiles: dict | None = None,
) -> records.OnDevice | None:
    """The model at ``path`` on the run's ``device`` (its integer form, every test image, the ADC ranges from
    the run's calibration sample; ``adc_profiles``: :func:`resnet8ptq.device.evaluate.adc_steps`); None
    unless ``device.enabled``."""
    if not device.enabled:
        return None
    from resnet8ptq.device.evaluate import evaluate_device  # torch: only for device runs

    integer = backend.integer_model(path)
    result = evaluate_device(integer, device, inputs, reference_predictions, name, adc_profiles)
    log.info(
        "%s: accuracy on device %s %.4f (%d predictions differ from the reference)",
        name, device.label, result.accuracy, result.differing_from_reference,
    )  # fmt: skip
    return records.OnDevice(result, integer, inputs.test_images, inputs.calibration_sample())
