"""Stage ``published``: the quantized models others publish for the backend's format
(:meth:`~resnet8ptq.backends.base.Backend.published_models`, e.g. MLPerf Tiny's int8 .tflite), each evaluated
like the backend's own (on the microcontroller path and the run's device too) and logged as a run of its own,
once per sweep: a stage of the sweep, run by whichever of its runs gets there first."""

from __future__ import annotations

from pathlib import Path

from resnet8ptq import records
from resnet8ptq.evaluate import Evaluated
from resnet8ptq.evaluation_cache import EvaluationCache
from resnet8ptq.execution import evaluate_quantized
from resnet8ptq.inputs import RunInputs
from resnet8ptq.records import RunContext, model_record
from resnet8ptq.resolve import Plan
from resnet8ptq.stages import RunRecord, Stage
from resnet8ptq.stages.costs import chip_costs
from resnet8ptq.stages.device import on_device
from resnet8ptq.stages.mcu import on_mcu
from resnet8ptq.tracking.runs import first_in_sweep


class PublishedStage(Stage):
    name = "published"
    order = 15  # after the FP32 baseline it is compared with, before this run's own quantization

    def enabled(self, plan: Plan) -> bool:
        """Only for the network the published models are of (``model.published_reference``)."""
        return bool(plan.cfg.model.published_reference)

    def run(self, inputs: RunInputs, record: RunRecord) -> None:
        plan = record.plan
        log_published_once(plan, record["fp32"].context, inputs)

    def log(self, inputs: RunInputs, record: RunRecord, result: None) -> None:
        """Nothing on this run: each published model is a run of its own, logged when it was evaluated."""


STAGE = PublishedStage()


def log_published_once(plan: Plan, context: RunContext, inputs: RunInputs) -> None:
    """Evaluate each quantized model published for the backend's format (:meth:`Backend.published_models`)
    on the test set like the backend's own (on the microcontroller path and the run's device too, its chip
    costed), and log it as a run of its own, once per sweep (on the device of the sweep's run that logs it
    first)."""
    cfg, backend, mcu, device = plan.cfg, plan.backend, plan.mcu, plan.device
    kept = EvaluationCache.of(backend, Path(cfg.cache_dir), inputs.test_set_digest).measured
    for name, published in backend.published_models(Path(cfg.cache_dir)).items():
        with first_in_sweep(context.experiment_id, **{records.REFERENCE_TAG: name}) as first:
            if not first:
                continue
            tolerance = cfg.native_tolerance_points
            result = evaluate_quantized(published, inputs.test_set, f"{name} (published)", tolerance, kept)
            model = model_record(cfg, backend, published.path, inputs.test_images, inputs.datasets.fp32)
            on_mcu_result = on_mcu(
                cfg, mcu, backend, Evaluated(name, published.path, result.reference), inputs
            )
            device_result = on_device(
                device, backend, Evaluated(f"{name} (published)", published.path, result.reference), inputs
            )
            costs = None
            if device_result is not None and plan.components.enabled:
                actions, out = device_result.result.actions, context.output_dir / f"published-{name}"
                costs = chip_costs(f"{name} (published)", actions, device, plan.components, out)
            evaluated = records.Published(name, published, result, on_mcu_result, device_result, costs)
            records.log_published(context, evaluated, model)
