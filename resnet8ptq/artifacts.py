"""The files each run logs as artifacts: evaluation tables and charts, per-layer SQNR, calibration ranges,
the resolved config. Each function writes into a directory and returns (artifact directory, file) pairs; a
chart's file is being drawn in the drawing process (:mod:`resnet8ptq.drawing`) when the function returns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from resnet8ptq.drawing import Drawing, draw
from resnet8ptq.evaluate import Evaluation
from resnet8ptq.metrics import roc_points
from resnet8ptq.plots import class_accuracy_png, confusion_matrix_png, layer_sqnr_png, roc_curve_png
from resnet8ptq.spec import LayerError, LayerPrecision, TensorRange

EVALUATION_DIR = "evaluation"
PREDICTIONS_FILE = "predictions.csv"  # image (test-set index), label, predicted: for paired tests

Artifact = tuple[str, Path | Drawing]
"""(artifact directory in the run, local file or the chart being drawn into it)."""


def evaluation_files(
    evaluation: Evaluation,
    out_dir: Path,
    title: str,
    class_names: Sequence[str],
    baseline: Evaluation | None = None,
) -> list[Artifact]:
    """Write the predictions, confusion matrix and per-class accuracy (CSV + PNG) into out_dir, the classes
    named ``class_names`` (a model scored otherwise: its scores and ROC curve, :func:`score_files`); return
    (artifact dir, file) pairs."""
    if not evaluation.metric.per_class:
        return score_files(evaluation, out_dir, title, baseline)
    out_dir.mkdir(parents=True, exist_ok=True)
    predictions = out_dir / PREDICTIONS_FILE
    pd.DataFrame({"label": evaluation.labels, "predicted": evaluation.predictions}).rename_axis(
        "image"
    ).to_csv(predictions)
    confusion_csv = out_dir / "confusion_matrix.csv"
    pd.DataFrame(evaluation.confusion, index=class_names, columns=class_names).rename_axis(
        "true \\ predicted"
    ).to_csv(confusion_csv)
    per_class = pd.DataFrame({"class": class_names, "accuracy": evaluation.class_accuracy})
    if baseline is not None:
        per_class["fp32_accuracy"] = baseline.class_accuracy
        per_class["delta"] = per_class["accuracy"] - per_class["fp32_accuracy"]
    class_csv = out_dir / "class_accuracy.csv"
    per_class.to_csv(class_csv, index=False)
    reference = None if baseline is None else baseline.class_accuracy
    return [
        (EVALUATION_DIR, predictions),
        (EVALUATION_DIR, confusion_csv),
        (
            EVALUATION_DIR,
            draw(
                confusion_matrix_png,
                evaluation.confusion,
                class_names,
                out_dir / "confusion_matrix.png",
                f"{title}: confusion matrix",
            ),
        ),
        (EVALUATION_DIR, class_csv),
        (
            EVALUATION_DIR,
            draw(
                class_accuracy_png,
                evaluation.class_accuracy,
                class_names,
                out_dir / "class_accuracy.png",
                f"{title}: per-class accuracy",
                reference,
            ),
        ),
    ]


def score_files(
    evaluation: Evaluation, out_dir: Path, title: str, baseline: Evaluation | None = None
) -> list[Artifact]:
    """An autoencoder's anomaly scores (``predictions.csv``: each test input's label, score and, where the
    data groups them, group) and the scored samples' ROC curve beside the FP32 model's (``roc_curve.png``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = out_dir / PREDICTIONS_FILE
    table = pd.DataFrame({"label": evaluation.labels, "score": evaluation.predictions})
    if evaluation.metric.groups is not None:
        table["group"] = evaluation.metric.groups
    table.rename_axis("image").to_csv(scores)
    scored = evaluation.metric.samples  # the scored samples (an audio clip's frames pooled)
    curves = {"this run": roc_points(*scored(evaluation.predictions, evaluation.labels))}
    if baseline is not None:
        curves["FP32"] = roc_points(*scored(baseline.predictions, baseline.labels))
    png = draw(roc_curve_png, curves, out_dir / "roc_curve.png", f"{title}: ROC, AUC {evaluation.value:.4f}")
    return [(EVALUATION_DIR, scores), (EVALUATION_DIR, png)]


def layer_error_files(layer_errors: list[LayerError], out_dir: Path, title: str) -> list[Artifact]:
    """Per-layer SQNR as CSV and bar chart (worst first)."""
    table = pd.DataFrame([vars(e) for e in layer_errors]).sort_values("sqnr_db")
    csv = out_dir / "layer_sqnr.csv"
    table.to_csv(csv, index=False)
    png = draw(
        layer_sqnr_png,
        table["layer"].tolist(),
        table["kind"].tolist(),
        table["sqnr_db"].to_numpy(),
        out_dir / "layer_sqnr.png",
        f"{title}: per-layer SQNR",
    )
    return [("analysis", csv), ("analysis", png)]


def layer_precision_file(
    layers: list[LayerPrecision], shared: Mapping[str, str], out_dir: Path
) -> list[Artifact]:
    """Every quantized layer's storage type and width as read back from the saved model, and which layer's
    quantization it takes, if another's (`takes_quantization_of`), as CSV."""
    path = out_dir / "layer_precision.csv"
    out_dir.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame([vars(layer) for layer in layers], columns=["layer", "kind", "dtype", "bits"])
    table["takes_quantization_of"] = table["layer"].map(shared)
    table.to_csv(path, index=False)
    return [("analysis", path)]


def config_file(cfg: DictConfig, output_dir: Path) -> list[Artifact]:
    """The resolved config as YAML."""
    path = output_dir / "resolved_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return [("config", path)]


def ranges_file(ranges: list[TensorRange], out_dir: Path) -> list[Artifact]:
    """The calibrated range of every activation tensor as CSV."""
    path = out_dir / "calibration_ranges.csv"
    pd.DataFrame([vars(r) for r in ranges]).to_csv(path, index=False)
    return [("calibration", path)]
