"""Stage ``fp32``: the FP32 model in the run's backend and its baseline (logged as a run of its own once per
sweep and backend), and the run's context tags."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from resnet8ptq import drawing, hardware, records
from resnet8ptq.backends.base import KERAS_SOURCE, Backend
from resnet8ptq.datasets import check_fits, class_names
from resnet8ptq.device.coverage import check_coverage, check_learnable_layers
from resnet8ptq.evaluate import Baseline, Kept, evaluate_baseline
from resnet8ptq.evaluation_cache import EvaluationCache
from resnet8ptq.inputs import RunInputs
from resnet8ptq.model import CanonicalModel, model_io
from resnet8ptq.records import RunContext, model_record
from resnet8ptq.resolve import fp32_model
from resnet8ptq.shared import Shared
from resnet8ptq.stages import RunRecord, Stage
from resnet8ptq.tracking.runs import set_tags


@dataclass(frozen=True)
class Fp32:
    """The stage's result: the canonical model, its baseline in the run's backend, and what the run's
    records share (:class:`RunContext`)."""

    canonical: CanonicalModel
    baseline: Baseline
    context: RunContext


class Fp32Stage(Stage):
    name = "fp32"
    order = 10

    def run(self, inputs: RunInputs, record: RunRecord) -> Fp32:
        """The canonical ONNX model (the .h5 for a backend that converts Keras itself) in the run's backend,
        its accuracy the baseline; the run's context tags (data, model, versions, hardware), logged now; the
        baseline's run, once per sweep and backend."""
        plan, shared = record.plan, record.shared
        cfg, backend = plan.cfg, plan.backend
        canonical = fp32_model(cfg.model, Path(cfg.cache_dir))
        input_shape, output_shape = model_io(canonical)
        model = f"model={cfg.model.name} ({canonical.source_path})"
        check_fits(inputs.dataset, input_shape, output_shape, inputs.metric, model)
        labels = inputs.metric.classes(output_shape)
        classes = class_names(cfg.model.classes, inputs.dataset, labels, f"model={cfg.model.name}")
        if plan.device.enabled:  # an operator the device has no integer form of: refused before any work
            check_coverage(canonical.onnx_path, plan.device.kind, f"model={cfg.model.name}")
        if cfg.algo.get("device_aware"):
            check_learnable_layers(canonical.onnx_path, f"model={cfg.model.name}")
        source = source_path(backend, canonical, canonical.onnx_path)
        drawing.wait_started()  # its start-up over before anything is timed
        kept = EvaluationCache.of(backend, Path(cfg.cache_dir), inputs.test_set_digest).measured
        baseline = fp32_baseline(shared, backend, source, Path(cfg.cache_dir), inputs, kept)
        tags = {
            "model": cfg.model.name,
            "data": inputs.dataset.name,
            "metric": inputs.metric.name,
            "classes": json.dumps(list(classes)),  # label order, for the report's per-class view
            "data.verified": inputs.dataset.verified,
            "model.sha256": canonical.source_sha256,
            **{f"version.{lib}": version for lib, version in backend.versions().items()},
            **hardware.detect().tags(),
        }
        set_tags(record.run_id, tags)
        fp32_record = model_record(
            cfg, backend, baseline.model.path, inputs.test_images, inputs.datasets.fp32
        )
        context = RunContext(
            plan.experiment_id,
            plan.params,
            plan.tags | tags,
            baseline,
            inputs.perf_subset,
            record.output_dir,
            classes,
        )
        records.log_baseline_once(context, backend.NAME, fp32_record)
        return Fp32(canonical, baseline, context)

    def log(self, inputs: RunInputs, record: RunRecord, result: Fp32) -> None:
        """Nothing more: the context tags are on the run from the start, the baseline's run is its own."""


STAGE = Fp32Stage()


def source_path(backend: Backend, canonical: CanonicalModel, onnx_path: Path) -> Path:
    """The FP32 file the backend starts from (:attr:`Backend.SOURCE`): ``onnx_path`` (the canonical ONNX
    model, or the `algo` steps' transform of it), or the .h5 for a backend that converts Keras itself."""
    return canonical.source_path if backend.SOURCE == KERAS_SOURCE else onnx_path


def fp32_baseline(
    shared: Shared,
    backend: Backend,
    onnx_path: Path,
    cache_dir: Path,
    inputs: RunInputs,
    kept: Kept | None = None,
) -> Baseline:
    """The backend's FP32 model evaluated on the test set, once per ``shared``, backend instance (see
    make_backend), model file and data set (or an earlier run's evaluation, from ``kept``)."""

    def evaluate() -> Baseline:
        model = backend.load_fp32(onnx_path, cache_dir / backend.NAME)
        return evaluate_baseline(model, inputs.test_set, f"{backend.NAME}-fp32", kept)

    return shared.get("baseline", (backend, onnx_path, cache_dir, inputs.dataset), evaluate)
