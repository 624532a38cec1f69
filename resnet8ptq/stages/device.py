"""Stage ``device`` (`device` != none): the saved model's integer form run as the device computes, every
test image, the ADC ranges from the run's calibration sample."""

from __future__ import annotations

import logging

from resnet8ptq import records
from resnet8ptq.backends.base import Backend
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.evaluate import Evaluated
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
        made, plan = record["quantize"].made, record.plan
        model = Evaluated(plan.name, made.quantized.path, made.result.reference)
        learned = made.prepared.adc_steps
        return on_device(plan.device, plan.backend, model, inputs, made.adc_profiles, learned)

    def log(self, inputs: RunInputs, record: RunRecord, result: records.OnDevice) -> None:
        reference = record["quantize"].made.result.reference.predictions
        records.log_device(record["fp32"].context, record.run_id, result, reference)


STAGE = DeviceStage()


def on_device(
    device: DeviceConfig,
    backend: Backend,
    model: Evaluated,
    inputs: RunInputs,
    adc_profiles: dict | None = None,
    learned: dict | None = None,
) -> records.OnDevice | None:
    """``model`` on the run's ``device`` (its integer form, every test image, the ADC ranges from the run's
    calibration sample, ``adc_profiles``: :func:`resnet8ptq.device.evaluate.adc_steps`, or ``learned`` by
    device-aware learning); None unless ``device.enabled``."""
    if not device.enabled:
        return None
    from resnet8ptq.device.evaluate import evaluate_device  # torch: only for device runs
    from resnet8ptq.device.requantizer import with_requantizer_bits

    integer = with_requantizer_bits(backend.integer_model(model.path), device.requantizer_bits)
    result = evaluate_device(integer, device, inputs, model, adc_profiles, learned)
    log.info(
        "%s: %s on device %s %.4f (%d predictions differ from the reference)",
        model.name, result.metric.title, device.label, result.accuracy, result.differing_from_reference,
    )  # fmt: skip
    return records.OnDevice(result, result.model or integer, inputs.test_images, inputs.calibration_sample())
