"""One run, top to bottom: data -> FP32 model -> quantize -> evaluate -> log to MLflow."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from resnet8ptq import hardware, tracking
from resnet8ptq.backends import get_backend
from resnet8ptq.backends.base import Backend, LayerError, Model, QuantizedModel
from resnet8ptq.config import quant_spec
from resnet8ptq.data import CLASS_NAMES, Cifar10, calibration_set, load_cifar10, to_model_input
from resnet8ptq.evaluate import Evaluation, evaluate, measure_latency
from resnet8ptq.execution import Verdict, judge
from resnet8ptq.model import CanonicalModel, ModelError, canonical_onnx, conversion_key, resolve_h5
from resnet8ptq.plots import class_accuracy_png, confusion_matrix_png, layer_sqnr_png

log = logging.getLogger(__name__)

LAYER_ERROR_IMAGES = 200  # calibration images used for the per-layer SQNR analysis


@dataclass(frozen=True)
class Baseline:
    """The FP32 model of one backend and how it did on the test set."""

    model: Model
    evaluation: Evaluation
    latency_ms_b1: float


@dataclass(frozen=True)
class QuantizedResult:
    """How a quantized model did: its reference semantics, its runtime form on this CPU, and the verdict."""

    reference: Evaluation
    runtime: Evaluation  # the same object as ``reference`` when the runtime runs the reference program
    verdict: Verdict
    latency_ms_b1: float  # of the runtime form


def run(cfg: DictConfig, output_dir: Path) -> float:
    """Quantize, evaluate and log one configuration; return its test accuracy (fraction)."""
    spec = quant_spec(cfg)  # invalid settings fail here, before any work
    experiment_id = tracking.configure(cfg.mlflow)
    params = tracking.run_params(cfg)
    backend_name = cfg.backend.name
    per_channel = "pc" if spec.per_channel else "pt"
    reduce_range = "-rr" if spec.reduce_range else ""
    run_name = (
        f"{backend_name}-{spec.activation}-{spec.weight}-{spec.calib.method}-{per_channel}{reduce_range}"
    )
    backend = get_backend(backend_name, native=cfg.backend.get("native", True), threads=threads_per_run(cfg))
    identity = result_identity(cfg, backend)
    tags = {
        "backend": backend_name,
        "quantized": "true",
        "calib": spec.calib.method,
        "per_channel": str(spec.per_channel).lower(),
        "reduce_range": str(spec.reduce_range).lower(),
        "config_hash": tracking.config_hash(params, identity),
        "git_commit": tracking.git_commit(),
    }
    resumable = not cfg.rerun and "unknown" not in identity.values()
    finished = tracking.skip_finished(experiment_id, run_name, tags["config_hash"]) if resumable else None
    if finished is not None:
        return finished  # resume: this configuration already FINISHED in an earlier run; no new run
    with tracking.child_run(experiment_id, run_name, tags, params) as run_id:
        # 1. Data: verified CIFAR-10, stratified calibration sample of the training split.
        data = load_dataset(cfg.data.root, cfg.data.download)
        calibration_images, _ = calibration_set(data, cfg.data.calib_per_class, cfg.data.seed)
        test_images, test_labels = test_set(data)

        # 2. FP32 model: the canonical ONNX, in this backend, with its accuracy as the baseline.
        canonical = fp32_model(cfg.model.path, cfg.model.sha256, Path(cfg.cache_dir))
        baseline = fp32_baseline(backend, canonical.onnx_path, Path(cfg.cache_dir), data)
        context_tags = {
            "data.verified": f"md5 ({data.layout} layout)",
            "model.sha256": canonical.h5_sha256,
            **{f"version.{lib}": version for lib, version in backend.versions().items()},
            **hardware.detect().tags(),
        }
        tracking.set_tags(run_id, context_tags)
        with tracking.sweep_lock(f"baseline-{backend_name}"):  # once per sweep, even with parallel jobs
            if not tracking.find_sibling(experiment_id, backend=backend_name, quantized="false"):
                log_baseline(experiment_id, backend_name, baseline, params, tags | context_tags, output_dir)

        # 3. Quantize.
        quantized = backend.quantize(canonical.onnx_path, calibration_images, spec, output_dir / "model")

        # 4. Evaluate on the full test set: the reference semantics, and the runtime form on this CPU.
        result = evaluate_quantized(
            quantized, test_images, test_labels, run_name, cfg.native_tolerance_points
        )
        log.info(
            "%s: accuracy %.4f (FP32 %.4f); %s: %s",
            run_name,
            result.reference.accuracy,
            baseline.evaluation.accuracy,
            result.verdict.execution,
            result.verdict.reason,
        )
        layer_errors = backend.layer_errors(
            baseline.model,
            quantized,
            canonical.onnx_path,
            calibration_images[:LAYER_ERROR_IMAGES],
            output_dir / "layer_errors",
        )

        # 5. Log.
        log_quantized(run_id, run_name, cfg, quantized, result, baseline, layer_errors, output_dir)
    return result.reference.accuracy


def evaluate_quantized(
    quantized: QuantizedModel, images: np.ndarray, labels: np.ndarray, run_name: str, tolerance_points: float
) -> QuantizedResult:
    """Evaluate the reference form and, when it is a different program, the runtime form; judge the runtime
    (:func:`resnet8ptq.execution.judge`). Throughput and latency are the runtime form's."""
    runtime = quantized.runtime
    reference = evaluate(quantized.reference, images, labels, desc=f"Evaluating {run_name} (reference)")
    measured = (
        reference
        if runtime.predict is quantized.reference
        else evaluate(runtime.predict, images, labels, desc=f"Evaluating {run_name} (runtime)")
    )
    dtypes = (quantized.activation_dtype, quantized.weight_dtype)
    verdict = judge(
        reference.accuracy, measured.accuracy, runtime, tolerance_points, hardware.detect(), dtypes
    )
    return QuantizedResult(reference, measured, verdict, measure_latency(runtime.predict, images))


def result_identity(cfg: DictConfig, backend: Backend) -> dict[str, str]:
    """Besides the settings, what decides a run's result (part of its config_hash): the canonical model
    (the .h5's actual sha256 with the converter versions) and the backend's library versions.

    Determined before the run, best effort: what cannot be determined yet is "unknown" (the run then fails
    with the reason; it is never skipped).
    """
    try:
        h5_sha256 = cfg.model.sha256 or resolve_h5(cfg.model.path, None, Path(cfg.cache_dir))[1]
        identity = {"model": conversion_key(h5_sha256)}
    except ModelError:
        identity = {"model": "unknown"}
    return identity | {f"version.{lib}": version for lib, version in backend.versions().items()}


def threads_per_run(cfg: DictConfig) -> int | None:
    """``cfg.threads``, else the cores divided among the launcher's parallel jobs (None: one job at a time,
    the libraries use every core)."""
    if cfg.threads:
        return cfg.threads
    n_jobs = HydraConfig.get().launcher.get("n_jobs") if HydraConfig.initialized() else None
    cores = os.cpu_count() or 1
    if not n_jobs or n_jobs == 1:
        return None
    return max(1, cores // (cores if n_jobs < 0 else n_jobs))


@functools.cache
def load_dataset(root: str, download: bool) -> Cifar10:
    """CIFAR-10, verified and read once per process (a multirun reuses it)."""
    return load_cifar10(Path(root), download=download)


@functools.cache
def test_set(data: Cifar10) -> tuple[np.ndarray, np.ndarray]:
    """All 10,000 test images as model input, with their labels."""
    return to_model_input(data.test_images), data.test_labels


def fp32_model(path: str | None, sha256: str | None, cache_dir: Path) -> CanonicalModel:
    """The canonical FP32 ONNX model (converted from the Keras .h5 once, then cached on disk)."""
    h5, actual_sha256 = resolve_h5(path, sha256, cache_dir)
    return canonical_onnx(h5, actual_sha256, cache_dir)


@functools.cache
def fp32_baseline(backend: Backend, onnx_path: Path, cache_dir: Path, data: Cifar10) -> Baseline:
    """The backend's FP32 model evaluated on the test set (once per process and backend)."""
    model = backend.load_fp32(onnx_path, cache_dir / backend.NAME)
    images, labels = test_set(data)
    evaluation = evaluate(model.predict, images, labels, desc=f"Evaluating {backend.NAME}-fp32")
    return Baseline(model, evaluation, measure_latency(model.predict, images))


def evaluation_metrics(evaluation: Evaluation, model_path: Path) -> dict[str, float]:
    """Metrics every run logs: accuracy, per-class accuracy, model size."""
    return {
        "accuracy": evaluation.accuracy,
        **{
            f"class_acc/{name}": acc for name, acc in zip(CLASS_NAMES, evaluation.class_accuracy, strict=True)
        },
        "model_size_bytes": model_path.stat().st_size,
    }


def evaluation_files(
    evaluation: Evaluation, out_dir: Path, title: str, baseline: Evaluation | None = None
) -> list[tuple[str, Path]]:
    """Write confusion matrix and per-class accuracy (CSV + PNG) into out_dir; return (artifact dir, file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    confusion_csv = out_dir / "confusion_matrix.csv"
    pd.DataFrame(evaluation.confusion, index=CLASS_NAMES, columns=CLASS_NAMES).rename_axis(
        "true \\ predicted"
    ).to_csv(confusion_csv)
    per_class = pd.DataFrame({"class": CLASS_NAMES, "accuracy": evaluation.class_accuracy})
    if baseline is not None:
        per_class["fp32_accuracy"] = baseline.class_accuracy
        per_class["delta"] = per_class["accuracy"] - per_class["fp32_accuracy"]
    class_csv = out_dir / "class_accuracy.csv"
    per_class.to_csv(class_csv, index=False)
    reference = None if baseline is None else baseline.class_accuracy
    return [
        ("evaluation", confusion_csv),
        (
            "evaluation",
            confusion_matrix_png(
                evaluation.confusion,
                CLASS_NAMES,
                out_dir / "confusion_matrix.png",
                f"{title}: confusion matrix",
            ),
        ),
        ("evaluation", class_csv),
        (
            "evaluation",
            class_accuracy_png(
                evaluation.class_accuracy,
                CLASS_NAMES,
                out_dir / "class_accuracy.png",
                f"{title}: per-class accuracy",
                reference,
            ),
        ),
    ]


def config_file(cfg: DictConfig, output_dir: Path) -> Path:
    """The resolved config as YAML."""
    path = output_dir / "resolved_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return path


def log_baseline(
    experiment_id: str, backend_name: str, baseline: Baseline, params: dict, tags: dict, output_dir: Path
) -> None:
    """Log this backend's FP32 model as a run of its own (tag quantized=false) beside the quantized runs."""
    name = f"{backend_name}-fp32"
    quantization = ("dtype", "calib", "per_channel", "reduce_range", "native_tolerance_points")
    fp32_params = {k: v for k, v in params.items() if not k.startswith(quantization)}
    fp32_tags = {
        **{k: v for k, v in tags.items() if k not in (*quantization, "config_hash")},
        "quantized": "false",
        "dtype.activation": "float32",
        "dtype.weight": "float32",
    }
    with tracking.child_run(experiment_id, name, fp32_tags, fp32_params) as run_id:
        metrics = {
            **evaluation_metrics(baseline.evaluation, baseline.model.path),
            "throughput_img_s": baseline.evaluation.throughput_img_s,
            "latency_ms_b1": baseline.latency_ms_b1,
            "eval_seconds": baseline.evaluation.eval_seconds,
        }
        tracking.log_metrics(run_id, {**metrics, "fp32_size_bytes": metrics["model_size_bytes"]})
        files = evaluation_files(baseline.evaluation, output_dir / "fp32", name)
        tracking.log_artifacts(run_id, [*files, ("model", baseline.model.path)])


def layer_error_files(layer_errors: list[LayerError], out_dir: Path, title: str) -> list[tuple[str, Path]]:
    """Per-layer SQNR as CSV and bar chart (worst first)."""
    table = pd.DataFrame([vars(e) for e in layer_errors]).sort_values("sqnr_db")
    csv = out_dir / "layer_sqnr.csv"
    table.to_csv(csv, index=False)
    png = layer_sqnr_png(
        table["layer"].tolist(),
        table["kind"].tolist(),
        table["sqnr_db"].to_numpy(),
        out_dir / "layer_sqnr.png",
        f"{title}: per-layer SQNR",
    )
    return [("analysis", csv), ("analysis", png)]


def log_quantized(
    run_id: str,
    run_name: str,
    cfg: DictConfig,
    quantized: QuantizedModel,
    result: QuantizedResult,
    baseline: Baseline,
    layer_errors: list[LayerError],
    output_dir: Path,
) -> None:
    """Everything a quantized run records: metrics, effective dtypes, execution, layer errors, artifacts."""
    fp32_size = baseline.model.path.stat().st_size
    worst = min(layer_errors, key=lambda error: error.sqnr_db)
    evaluation, verdict = result.reference, result.verdict
    native = {}
    if verdict.gap_points is not None:  # integer kernels ran: their accuracy beside the reference
        native = {"accuracy_native": result.runtime.accuracy, "kernel_gap_points": verdict.gap_points}
    passes = {id(result.reference): result.reference, id(result.runtime): result.runtime}.values()
    metrics = {
        **evaluation_metrics(evaluation, quantized.path),
        "accuracy_reference": evaluation.accuracy,
        **native,
        "throughput_img_s": result.runtime.throughput_img_s,
        "latency_ms_b1": result.latency_ms_b1,
        "eval_seconds": sum(evaluation.eval_seconds for evaluation in passes),
        "accuracy_delta": evaluation.accuracy - baseline.evaluation.accuracy,
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
    tracking.log_metrics(run_id, metrics)
    tracking.set_tags(
        run_id,
        {
            "dtype.activation": quantized.activation_dtype,
            "dtype.weight": quantized.weight_dtype,
            "execution": verdict.execution,
            "execution_reason": verdict.reason,
            "sqnr_worst_layer": f"{worst.layer} ({worst.kind}, {worst.sqnr_db:.1f} dB)",
            **quantized.tags,
        },
    )
    ranges_csv = output_dir / "calibration_ranges.csv"
    pd.DataFrame([vars(r) for r in quantized.ranges]).to_csv(ranges_csv, index=False)
    tracking.log_artifacts(
        run_id,
        [
            *evaluation_files(evaluation, output_dir / "evaluation", run_name, baseline.evaluation),
            *layer_error_files(layer_errors, output_dir, run_name),
            ("model", quantized.path),
            ("calibration", ranges_csv),
            ("config", config_file(cfg, output_dir)),
        ],
    )
