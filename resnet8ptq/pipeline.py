"""One run, top to bottom: resolve the configuration, then the stages (:mod:`resnet8ptq.stages`: the FP32
model and baseline -> algorithms and quantization with its evaluation -> layer errors -> device ->
microcontroller, and any stage added as a module), each result logged once at the end."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig

from resnet8ptq import drawing
from resnet8ptq.inputs import run_inputs
from resnet8ptq.resolve import resolve
from resnet8ptq.shared import Shared
from resnet8ptq.stages import RunRecord, registered
from resnet8ptq.tracking.runs import child_run, skip_finished


def run(
    cfg: DictConfig, output_dir: Path, extra_tags: Mapping[str, str] | None = None, *, shared: Shared
) -> str:
    """Quantize, evaluate and log one configuration (``extra_tags`` on its run); return the id of its run, or
    of the earlier FINISHED run of the same configuration that it resumes. ``shared``: what the runs of this
    process share (:mod:`resnet8ptq.shared`; a test passes its own)."""
    drawing.start()  # the charts' process starts up while the run sets up
    plan = resolve(cfg, extra_tags, shared)  # bad settings fail here, before any work
    finished = (
        skip_finished(plan.experiment_id, plan.name, plan.tags["config_hash"]) if plan.resumable else None
    )
    if finished is not None:
        return finished  # resume: this configuration already FINISHED in an earlier run; no new run
    with child_run(plan.experiment_id, plan.name, plan.tags | plan.extra_tags, plan.params) as run_id:
        # Verified CIFAR-10, the stratified calibration sample of the training split, MLPerf Tiny's
        # performance subset of the test split.
        inputs = run_inputs(cfg, shared)
        record = RunRecord(plan, run_id, output_dir, shared)
        stages = [stage for stage in registered() if stage.enabled(plan)]
        for stage in stages:
            record.results[stage.name] = stage.run(inputs, record)
        for stage in stages:  # each result logged once, after every stage has run
            stage.log(inputs, record, record.results[stage.name])
    return run_id
