"""What each run records in MLflow: the metrics, tags and artifacts of a quantized run, of the backend's FP32
baseline run and of a published model's reference run (the names are the contract docs/mlflow.md lists and the
report reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from mlflow.data.numpy_dataset import NumpyDataset
from omegaconf import DictConfig

from resnet8ptq.algorithms import Prepared
from resnet8ptq.artifacts import (
    Artifact,
    config_file,
    evaluation_files,
    layer_error_files,
    layer_precision_file,
    ranges_file,
)
from resnet8ptq.backends.base import Backend, MlflowFlavor, QuantizedModel
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.digests import device_digests, run_digests
from resnet8ptq.evaluate import Baseline, Evaluation
from resnet8ptq.evaluation_cache import REUSED_TAG as EVAL_REUSED_TAG
from resnet8ptq.execution import QuantizedResult
from resnet8ptq.layers import raised_in
from resnet8ptq.spec import LayerError
from resnet8ptq.tracking.models import log_datasets, log_model
from resnet8ptq.tracking.runs import child_run, first_in_sweep, log_artifacts, log_metrics, set_tags

if TYPE_CHECKING:  # the device modules import torch: only device runs load them
    from resnet8ptq.device.evaluate import DeviceResult
    from resnet8ptq.device.graph import IntegerModel
    from resnet8ptq.mcu.evaluate import McuResult

QUANTIZATION_SETTINGS = (
    "dtype",
    "calib",
    "algo",
    "per_channel",
    "reduce_range",
    "layer_bits",
    "native_tolerance_points",
    "device",
)
"""Params and tags of a quantized run that an FP32 run does not have (``device.*``: a published or FP32
model's run is never a device run)."""
PERF_SUBSET_METRIC = "accuracy_perf_subset"
"""Accuracy on MLPerf Tiny's 200-image performance subset of the test set."""
REFERENCE_TAG = "reference"
"""Tag of a published model's run: its publisher (``mlperf``)."""


def evaluation_metrics(
    evaluation: Evaluation, model_path: Path, perf_subset: np.ndarray, class_names: Sequence[str]
) -> dict[str, float]:
    """Metrics every run logs: the model's metric (``accuracy``, ``auc``: :mod:`resnet8ptq.metrics`) with its
    95% confidence interval; for a classifier also the accuracy on MLPerf Tiny's performance subset (from
    the same predictions; where the data has one) and per-class accuracy (classes without a test sample
    left out); model size."""
    key = evaluation.metric.key
    low, high = evaluation.interval
    classifier = {}
    if evaluation.metric.per_class:
        per_class = zip(class_names, evaluation.class_accuracy, strict=True)
        classifier = {
            **({PERF_SUBSET_METRIC: evaluation.subset_accuracy(perf_subset)} if perf_subset.size else {}),
            **{f"class_acc/{name}": acc for name, acc in per_class if np.isfinite(acc)},
        }
    return {
        key: evaluation.value,
        f"{key}_ci_low": low,
        f"{key}_ci_high": high,
        **classifier,
        "model_size_bytes": model_path.stat().st_size,
    }


@dataclass(frozen=True)
class ModelRecord:
    """What logs a run's model as an MLflow Model and its datasets as run inputs."""

    flavor: MlflowFlavor | None  # None: no MLflow Model (``mlflow.log_models=false``)
    input_example: np.ndarray
    datasets: Mapping[str, NumpyDataset]  # context -> dataset
    classes: int = -1  # the model's outputs, where the configuration names them (-1: not known)

    def log(self, run_id: str, name: str) -> None:
        """Datasets as inputs, then the model named ``name`` (linked to the metrics logged before); tag
        ``model_uri``."""
        log_datasets(run_id, self.datasets)
        if self.flavor is not None:
            uri = log_model(run_id, name, self.flavor, self.input_example, self.classes)
            set_tags(run_id, {"model_uri": uri})


def model_record(
    cfg: DictConfig,
    backend: Backend,
    path: Path,
    test_images: np.ndarray,
    datasets: Mapping[str, NumpyDataset],
) -> ModelRecord:
    """What logs the model at ``path`` with its datasets: as an MLflow Model (two test images as its input
    example) unless ``mlflow.log_models=false``, when only the datasets are logged (the model file is an
    artifact either way)."""
    flavor = backend.mlflow_flavor(path) if cfg.mlflow.log_models else None
    return ModelRecord(flavor, test_images[:2], datasets, len(cfg.model.classes) or -1)


@dataclass(frozen=True)
class RunContext:
    """What the records of one run share: its experiment, its settings and tags (a run of a model this
    configuration did not make drops the quantization ones, :func:`unquantized`), the backend's FP32
    baseline it is compared with, MLPerf Tiny's performance subset, and the directory its files go to."""

    experiment_id: str
    params: Mapping[str, Any]
    tags: Mapping[str, str]
    baseline: Baseline
    perf_subset: np.ndarray
    output_dir: Path
    class_names: tuple[str, ...] = CLASS_NAMES  # the model's classes in label order


@dataclass
class Quantization:
    """A quantization's model, how it was made and its evaluation: what a quantized run records, kept for
    the device runs that share it."""

    run_name: str  # the run that made it
    prepared: Prepared
    quantized: QuantizedModel
    shared: dict[str, str]  # which layer takes which one's quantization (layers.sharing)
    result: QuantizedResult
    layer_errors: list[LayerError] | None = None  # computed once, after the evaluation's charts are drawn
    tags: dict[str, str] = field(default_factory=dict)  # what the checks read back (dtype.first_last)
    adc_profiles: dict[tuple, Any] = field(default_factory=dict)  # by crossbar layout (device/evaluate.py)


@dataclass(frozen=True)
class Quantized:
    """The ``quantize`` stage's result: the quantization (shared by the device runs that reuse it) and this
    run's evaluation files (:func:`~resnet8ptq.artifacts.evaluation_files`, drawn while later stages run)."""

    made: Quantization
    evaluation: list[Artifact]


def unquantized(params: Mapping[str, Any], tags: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """A quantized run's params and tags without its quantization settings: those of a run of a model this
    configuration did not make (the FP32 baseline, a published model)."""
    return (
        {k: v for k, v in params.items() if not k.startswith(QUANTIZATION_SETTINGS)},
        {
            k: v
            for k, v in tags.items()
            if k not in (*QUANTIZATION_SETTINGS, "config_hash") and not k.startswith("device.")
        },
    )


def log_baseline_once(context: RunContext, backend_name: str, model: ModelRecord) -> None:
    """Log the backend's FP32 model as a run of its own (tag quantized=false) beside the quantized runs, once
    per sweep, network and backend, also when parallel jobs of the sweep get here together."""
    baseline, network = context.baseline, context.tags.get("model", "resnet8")
    with first_in_sweep(
        context.experiment_id, backend=backend_name, quantized="false", model=network
    ) as first:
        if not first:
            return
        name = f"{backend_name}-fp32" if network == "resnet8" else f"{network}-{backend_name}-fp32"
        fp32_params, fp32_tags = unquantized(context.params, context.tags)
        fp32_tags |= {
            "quantized": "false",
            "dtype.activation": "float32",
            "dtype.weight": "float32",
            "dtype.activation_bits": "32",
            "dtype.weight_bits": "32",
        }
        with child_run(context.experiment_id, name, fp32_tags, fp32_params) as run_id:
            metrics = {
                **evaluation_metrics(
                    baseline.evaluation, baseline.model.path, context.perf_subset, context.class_names
                ),
                "throughput_img_s": baseline.evaluation.throughput_img_s,
                "latency_ms_b1": baseline.latency_ms_b1,
                "eval_seconds": baseline.evaluation.eval_seconds,
            }
            log_metrics(run_id, {**metrics, "fp32_size_bytes": metrics["model_size_bytes"]})
            set_tags(
                run_id,
                {
                    **run_digests(baseline.model.path, baseline.evaluation.predictions),
                    EVAL_REUSED_TAG: str(baseline.reused).lower(),
                },
            )
            files = evaluation_files(
                baseline.evaluation, context.output_dir / "fp32", name, context.class_names
            )
            model.log(run_id, name)  # while the charts are drawn
            log_artifacts(run_id, [*files, ("model", baseline.model.path)])


def quantized_metrics(
    quantized: QuantizedModel,
    result: QuantizedResult,
    baseline: Baseline,
    layer_errors: list[LayerError],
    context: RunContext,
) -> dict[str, float]:
    """Accuracy (reference) and, where integer kernels ran, native accuracy and the gap; size, speed, timings,
    worst per-layer SQNR, and the backend's own metrics."""
    evaluation, verdict = result.reference, result.verdict
    key, native = evaluation.metric.key, {}
    if verdict.gap_points is not None:  # integer kernels ran: their score beside the reference
        native = {f"{key}_native": result.runtime.value, "kernel_gap_points": verdict.gap_points}
    passes = {id(result.reference): result.reference, id(result.runtime): result.runtime}.values()
    fp32_size = baseline.model.path.stat().st_size
    return {
        **evaluation_metrics(evaluation, quantized.path, context.perf_subset, context.class_names),
        f"{key}_reference": evaluation.value,
        **native,
        "throughput_img_s": result.speed.throughput_img_s,
        "latency_ms_b1": result.latency_ms_b1,
        "eval_seconds": sum(evaluation.eval_seconds for evaluation in passes),
        f"{key}_delta": evaluation.value - baseline.evaluation.value,
        "fp32_size_bytes": fp32_size,
        "size_ratio": quantized.path.stat().st_size / fp32_size,
        "calib_seconds": quantized.calib_seconds,
        "quantize_seconds": quantized.quantize_seconds,
        **{
            f"sqnr_{kind}_min_db": min(e.sqnr_db for e in layer_errors if e.kind == kind)
            for kind in {e.kind for e in layer_errors}
        },
        **quantized.metrics,
    }


def log_quantized(
    context: RunContext,
    run_id: str,
    run_name: str,
    cfg: DictConfig,
    quantization: Quantized,
    model: ModelRecord,
) -> None:
    """Everything a quantized run records: metrics, effective dtypes, execution, the evaluation's files
    (:func:`~resnet8ptq.artifacts.evaluation_files`), layer errors, every layer's precision and which layer
    takes which one's quantization, the layers raised to 16 bits, artifacts, the MLflow Model and the
    datasets; what the PTQ algorithms did and their seconds."""
    made, evaluation = quantization.made, quantization.evaluation
    quantized, prepared, output_dir = made.quantized, made.prepared, context.output_dir
    layer_errors = made.layer_errors or []
    # Drawn while the run logs; none without the analysis (layer_analysis=false).
    layer_files = layer_error_files(layer_errors, output_dir, run_name) if layer_errors else []
    worst = min(layer_errors, key=lambda error: error.sqnr_db, default=None)
    worst_tag = {"sqnr_worst_layer": f"{worst.layer} ({worst.kind}, {worst.sqnr_db:.1f} dB)"} if worst else {}
    raised = raised_in(quantized.layers, cfg.dtype.activation_bits)
    metrics = quantized_metrics(quantized, made.result, context.baseline, layer_errors, context)
    log_metrics(run_id, {**metrics, "algo_seconds": prepared.seconds})
    set_tags(
        run_id,
        {
            **read_back_tags(quantized, made.result),
            **worst_tag,
            **({"mixed_precision.raised": ",".join(raised)} if raised else {}),
            **made.tags,
            **prepared.tags,
            **run_digests(quantized.path, made.result.reference.predictions, quantized.ranges),
        },
    )
    files = [
        *evaluation,
        *layer_files,
        *layer_precision_file(quantized.layers, made.shared, output_dir),
        ("model", quantized.path),
        *ranges_file(quantized.ranges, output_dir),
        *config_file(cfg, output_dir),
    ]
    model.log(run_id, run_name)  # while the charts are drawn
    log_artifacts(run_id, files)


def read_back_tags(quantized: QuantizedModel, result: QuantizedResult) -> dict[str, str]:
    """A quantized model's effective types and widths (read back from its file), how it executed, and the
    backend's own tags."""
    return {
        "dtype.activation": quantized.activation_dtype,
        "dtype.weight": quantized.weight_dtype,
        "dtype.activation_bits": str(quantized.activation_bits),
        "dtype.weight_bits": str(quantized.weight_bits),
        "execution": result.verdict.execution,
        "execution_reason": result.verdict.reason,
        EVAL_REUSED_TAG: str(result.reused).lower(),
        **quantized.tags,
    }


@dataclass
class OnDevice:
    """A published model on the run's device: what :func:`log_device` records (``calibration``: the sample
    the ADC ranges came from, :meth:`resnet8ptq.inputs.RunInputs.calibration_sample`)."""

    result: DeviceResult
    model: IntegerModel
    test_images: np.ndarray
    calibration: dict[str, Any]


@dataclass(frozen=True)
class Published:
    """A published quantized model (``name``: its publisher, e.g. ``mlperf``) evaluated like the backend's
    models: on the test set, on the microcontroller path (``mcu``) and on the run's device (``device``)."""

    name: str
    quantized: QuantizedModel
    result: QuantizedResult
    mcu: McuResult | None = None
    device: OnDevice | None = None
    # its chip's costs: a resnet8ptq.stages.StageResult (not imported: the stages import this module)
    costs: Any = None


def log_published(context: RunContext, evaluated: Published, model: ModelRecord) -> None:
    """Log a published quantized model as a run of its own (tags ``reference=<name>``, quantized=true); Δ
    against the backend's FP32; with a device, its accuracy on the sweep's device and the same ``device/``
    export as a device run (the run's ``device.*`` tags say which device). Not logged: what the tool did not
    do (calibration, quantization, layer errors, config_hash)."""
    name, published, result, device = evaluated.name, evaluated.quantized, evaluated.result, evaluated.device
    run_name = f"{name}-{published.activation_dtype}-published"
    run_params, run_tags = unquantized(context.params, context.tags)
    run_tags |= {"quantized": "true", REFERENCE_TAG: name}
    if device is not None:
        run_tags |= {k: v for k, v in context.tags.items() if k.startswith("device.")}
    with child_run(context.experiment_id, run_name, run_tags, run_params) as run_id:
        metrics = quantized_metrics(published, result, context.baseline, [], context)
        log_metrics(
            run_id, {k: v for k, v in metrics.items() if k not in ("calib_seconds", "quantize_seconds")}
        )
        set_tags(
            run_id,
            read_back_tags(published, result) | run_digests(published.path, result.reference.predictions),
        )
        evaluation_dir = context.output_dir / f"published-{name}"
        files = evaluation_files(
            result.reference, evaluation_dir, run_name, context.class_names, context.baseline.evaluation
        )
        model.log(run_id, run_name)  # while the charts are drawn
        log_artifacts(run_id, [*files, ("model", published.path)])
        if evaluated.mcu is not None:
            log_mcu(run_id, evaluated.mcu, evaluation_dir)
        if device is not None:
            here = replace(context, output_dir=evaluation_dir)
            log_device(here, run_id, device, result.reference.predictions)
        if evaluated.costs is not None:
            evaluated.costs.log(run_id)


def log_device(context: RunContext, run_id: str, device: OnDevice, reference_predictions: np.ndarray) -> None:
    """A device run's record (`device` != none): accuracy on the device over its noise draws, the reader of
    the integer form, and the artifacts ``device/``: every test image's label with the reference's and the
    device's prediction, the accuracy of each noise draw, the ADC steps, the DAC ranges, and the integer
    parameters with golden vectors (:func:`resnet8ptq.device.export.export`); for a crossbar,
    ``crossbar.json`` with the ``calibration`` sample's description
    (:func:`resnet8ptq.device.export.export_crossbar`)."""
    import pandas as pd

    from resnet8ptq.device.actions import table as action_table
    from resnet8ptq.device.adc import adc_table
    from resnet8ptq.device.dac import dac_table
    from resnet8ptq.device.export import export, export_crossbar

    result, model = device.result, device.model
    out_dir = context.output_dir / "device"
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = out_dir / "predictions.csv"
    pd.DataFrame(
        {"label": result.labels, "reference": reference_predictions, "device": result.predictions}
    ).to_csv(predictions, index_label="image")
    draws = out_dir / "accuracy_by_draw.csv"
    pd.DataFrame({"seed": range(len(result.accuracies)), "accuracy": result.accuracies}).to_csv(
        draws, index=False
    )
    files = [predictions, draws]
    if result.adc_steps:
        steps = out_dir / "adc_steps.csv"
        adc_table(result.adc_steps).to_csv(steps, index=False)
        files.append(steps)
    if result.dac_ranges:
        ranges = out_dir / "dac_ranges.csv"
        dac_table(model, result.dac_ranges, result.device.dac_bits).to_csv(ranges, index=False)
        files.append(ranges)
    if result.bias_corrections:
        from resnet8ptq.device.bias_correction import corrections_table

        corrected = out_dir / "bias_corrections.csv"
        corrections_table(result.bias_corrections).to_csv(corrected, index=False)
        files.append(corrected)
    if result.layer_sqnr:
        sqnr = out_dir / "layer_sqnr.csv"
        table = pd.DataFrame({"layer": list(result.layer_sqnr), "sqnr_db": list(result.layer_sqnr.values())})
        table.to_csv(sqnr, index=False)
        files.append(sqnr)
    if result.actions:
        actions = out_dir / "actions.csv"
        pd.DataFrame(action_table(result.actions)).to_csv(actions, index=False)
        files.append(actions)
    files += export(model, device.test_images, out_dir)
    if result.device is not None and result.device.kind == "cim":
        files.append(export_crossbar(model, result.device, device.calibration, out_dir, result.dac_ranges))
    log_metrics(run_id, result.metrics())
    worst = {"device.worst_layer": result.worst_layer} if result.layer_sqnr else {}
    set_tags(run_id, {"device.source": model.source, **worst, **device_digests(model, result.predictions)})
    log_artifacts(run_id, [("device", path) for path in files])


def log_mcu(run_id: str, result: McuResult, output_dir: Path) -> None:
    """A TFLite model's microcontroller path (`mcu`): TFLM's accuracy and its comparison with LiteRT's
    reference kernels, the arena, flash, board fits and NPU estimate; artifacts ``mcu/``: the allocator's
    report, the planned tensors (largest first) and every test image's label with both predictions."""
    import pandas as pd

    from resnet8ptq.mcu.evaluate import planned_table

    out_dir = output_dir / "mcu"
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "arena_report.txt"
    report.write_text(result.arena.report + "\n")
    tensors = out_dir / "arena_tensors.csv"
    pd.DataFrame(planned_table(result.planned)).to_csv(tensors, index=False)
    predictions = out_dir / "predictions.csv"
    pd.DataFrame(
        {"label": result.labels, "reference": result.reference_predictions, "tflm": result.predictions}
    ).to_csv(predictions, index_label="image")
    log_metrics(run_id, result.metrics())
    set_tags(run_id, result.tags())
    log_artifacts(run_id, [("mcu", path) for path in (report, tensors, predictions)])
