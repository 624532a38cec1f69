"""Writes the comparison report of a sweep's runs (or a whole experiment's), read back from MLflow.

:func:`write_report` and :func:`write_experiment_report` write report.md, a self-contained report.html and
the PNGs they show into a directory, and log them to the sweep's parent run under `report/`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.config import ReportConfig
from resnet8ptq.errors import ReportError
from resnet8ptq.records import REFERENCE_TAG
from resnet8ptq.report.analysis import hardware_lines
from resnet8ptq.report.chip import chip_section
from resnet8ptq.report.device import device_section
from resnet8ptq.report.mcu import deployability_section
from resnet8ptq.report.networks import metric_note, network_section
from resnet8ptq.report.published import published_section
from resnet8ptq.report.render import to_html
from resnet8ptq.report.runs import comparison_table, configured, latest_per_config, runs_frame
from resnet8ptq.report.search import budget_section, mixed_precision_section, search_section
from resnet8ptq.report.sections import (
    Report,
    added_stage_section,
    comparison_rows,
    execution_section,
    failed_rows,
    layer_error_section,
    nothing_to_report_message,
    per_class_section,
    recommendation_section,
    significance_section,
    tradeoff_section,
)
from resnet8ptq.report.significance import (
    load_correctness,
    paired_tests,
    prediction_sources,
    with_device_classes,
)
from resnet8ptq.report.widths import accuracy_map_section, algorithm_section
from resnet8ptq.tracking.runs import REUSED_TAG_PREFIX
from resnet8ptq.tracking.search import search_all
from resnet8ptq.tracking.sweep import UNSUPPORTED_TAG_PREFIX

__all__ = ["ARTIFACT_DIR", "ReportError", "write_experiment_report", "write_report"]

log = logging.getLogger(__name__)

ARTIFACT_DIR = "report"
COLUMNS_NOTE = (
    "`95% CI`: Wilson interval of the accuracy; `p vs FP32`: exact McNemar test against the backend's FP32 "
    "model on the same test images, Holm-adjusted over the configurations (`*`: significant at 0.05); "
    "see [Significance](#significance)."
)
DEVICE_COLUMNS_NOTE = (
    "Accuracy on the device: `accuracy_device` for a device run (its interval over the noise draws when "
    "there are several; `p vs FP32` on the device's predictions), the reference accuracy for the other "
    "rows; `reference (%)`: the reference semantics of the same quantized model."
)


def markdown(report: Report) -> str:
    """The whole report as Markdown (writing its figures into the report's directory)."""
    table = report.table
    published = int(table["quantized"].sum()) - len(configured(table))
    counts = (
        f"finished: {len(configured(table))} quantized, "
        + (f"{published} published model(s), " if published else "")
        + f"{int((~table['quantized']).sum())} FP32 baseline(s); failed or unfinished: {len(report.failed)}"
    )
    parts = [
        f"# {report.title}",
        "\n".join(f"- {line}" for line in [*report.context, *hardware_lines(table), counts]),
    ]
    if not report.has_results:
        parts.append(f"**{nothing_to_report_message(report)}**")
    else:
        parts += recommendation_section(table, report.max_drop_points)
        parts += search_section(report) + mixed_precision_section(report) + budget_section(report)
    if len(table):
        parts += ["## Comparison", comparison_rows(table, report.max_drop_points).markdown(), COLUMNS_NOTE]
        parts += [DEVICE_COLUMNS_NOTE] if table["on_device"].any() else []
        scored = metric_note(table)
        parts += [scored] if scored else []
        parts += network_section(table)
        parts += published_section(table) + execution_section(table)
    if report.has_results:
        parts += significance_section(table)
        parts += accuracy_map_section(report) + algorithm_section(table) + device_section(report)
        parts += chip_section(report, report.chip_drop_points)
        parts += deployability_section(report)
        parts += per_class_section(report)
        parts += layer_error_section(table) + added_stage_section(table) + tradeoff_section(report)
    parts.append(f"## Failed runs ({len(report.failed)})")
    parts.append(failed_rows(report.failed).markdown() if len(report.failed) else "None: every run finished.")
    return "\n\n".join(parts) + "\n"


def tested_table(client: MlflowClient, frame: pd.DataFrame) -> pd.DataFrame:
    """The comparison table of the runs, with the paired tests of their logged predictions (a device run's on
    the device)."""
    table = comparison_table(frame)
    correct, labels = load_correctness(client, prediction_sources(table))
    return paired_tests(with_device_classes(table, correct, labels), correct)


def _finish(report: Report, client: MlflowClient, parent_run_id: str | None) -> Path | None:
    """Write report.md, report.html and PNGs, log them to the parent run; report.html, None if empty."""
    report.out_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    images = [drawing.path() for drawing in report.images]
    md_path, html_path = report.out_dir / "report.md", report.out_dir / "report.html"
    md_path.write_text(text, encoding="utf-8")
    html_path.write_text(to_html(text, report.title, images), encoding="utf-8")
    if parent_run_id is not None:
        for path in (md_path, html_path, *images):
            client.log_artifact(parent_run_id, str(path), ARTIFACT_DIR)
    if not report.has_results:
        log.warning("%s Report saying so: %s", nothing_to_report_message(report), md_path)
        return None
    log.info("Comparison report: %s", html_path)
    return html_path


def _context(run_count: int, superseded: int, extra: Sequence[str]) -> list[str]:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [*extra, f"runs read: {run_count}", f"generated: {now}"]
    if superseded:
        lines.append(f"older reruns of the same configuration not shown: {superseded}")
    return lines


def write_report(
    parent_run_id: str,
    out_dir: Path | None = None,
    max_drop_points: float = ReportConfig.max_drop_points,
    tracking_uri: str | None = None,
    chip_drop_points: float = ReportConfig.chip_drop_points,
) -> Path | None:
    """Report on the children of a sweep (parent) run, into `out_dir` (default: its `sweep_dir` tag).

    Returns report.html, or None when no quantized run finished (the report then says so).
    """
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = search_all(client, [parent.info.experiment_id], {"tags.mlflow.parentRunId": parent_run_id})
    reused = reused_runs(client, parent, children)
    frame = runs_frame([*children, *reused])
    tags = parent.data.tags
    default_dir = (
        Path(tags["sweep_dir"]) if tags.get("sweep_dir") else Path("runs") / f"report-{parent_run_id}"
    )
    context = [
        f"parent run: {parent.info.run_name} ({parent_run_id}), status {parent.info.status}",
        f"overrides: {tags.get('overrides', '?')}",
        f"sweep dir: {tags.get('sweep_dir', '?')}",
        f"accuracy-drop limit: {max_drop_points:g} points",
    ]
    refused = [value for key, value in sorted(tags.items()) if key.startswith(UNSUPPORTED_TAG_PREFIX)]
    if refused:
        context.append(f"configurations their backend refused (not run): {len(refused)}")
        context += [f"refused: {message}" for message in dict.fromkeys(refused)]
    if reused:
        count = sum(
            run.data.tags.get("quantized") == "true" and REFERENCE_TAG not in run.data.tags for run in reused
        )
        context.append(f"reused from earlier sweeps: {count} configurations that had already FINISHED")
    report = Report(
        title=f"Quantization report: {parent.info.run_name}",
        context=_context(len(frame), 0, context),
        table=tested_table(client, frame),
        failed=frame[frame["status"] != "FINISHED"],
        max_drop_points=max_drop_points,
        chip_drop_points=chip_drop_points,
        out_dir=Path(out_dir or default_dir),
        parent_tags=dict(tags),
    )
    return _finish(report, client, parent_run_id)


def reused_runs(client: MlflowClient, parent: Run, children: list[Run]) -> list[Run]:
    """The earlier runs a resumed sweep reused (tags `reused.*`), with the FP32 baselines of their sweeps
    for the backends this sweep has no baseline of, and their sweeps' published models' runs (tag
    `reference`) this sweep has none of."""
    ids = [value for key, value in parent.data.tags.items() if key.startswith(REUSED_TAG_PREFIX)]
    reused = [client.get_run(run_id) for run_id in ids]
    published = {run.data.tags.get(REFERENCE_TAG) for run in children} - {None}
    for sweep in {run.data.tags.get("mlflow.parentRunId", "") for run in reused}:
        conditions = {
            "tags.mlflow.parentRunId": sweep,
            "tags.quantized": "true",
            "attributes.status": "FINISHED",
        }
        for run in search_all(client, [parent.info.experiment_id], conditions):
            if run.data.tags.get(REFERENCE_TAG, "") not in published | {""}:
                reused.append(run)
                published.add(run.data.tags[REFERENCE_TAG])
    have = {run.data.tags.get("backend") for run in children if run.data.tags.get("quantized") == "false"}
    for backend, run in {r.data.tags.get("backend"): r for r in reused}.items():
        if backend in have:
            continue
        conditions = {
            "tags.mlflow.parentRunId": run.data.tags.get("mlflow.parentRunId", ""),
            "tags.quantized": "false",
            "tags.backend": backend or "",
            "attributes.status": "FINISHED",
        }
        reused += search_all(client, [run.info.experiment_id], conditions)[:1]
        have.add(backend)
    return reused


def write_experiment_report(
    experiment_name: str,
    out_dir: Path | None = None,
    max_drop_points: float = ReportConfig.max_drop_points,
    tracking_uri: str | None = None,
    chip_drop_points: float = ReportConfig.chip_drop_points,
) -> Path | None:
    """Report on every run of an experiment (newest run per configuration) into `out_dir`
    (default: runs/report-<experiment>). Returns report.html, or None when nothing finished."""
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ReportError(f"No experiment {experiment_name!r} in MLflow store {client.tracking_uri}.")
    frame = runs_frame(search_all(client, [experiment.experiment_id], {}))
    latest, superseded = latest_per_config(frame)
    report = Report(
        title=f"Quantization report: experiment {experiment_name}",
        context=_context(
            len(frame),
            superseded,
            [f"accuracy-drop limit: {max_drop_points:g} points", f"experiment: {experiment_name}"],
        ),
        table=tested_table(client, latest),
        failed=latest[latest["status"] != "FINISHED"],
        max_drop_points=max_drop_points,
        chip_drop_points=chip_drop_points,
        out_dir=Path(out_dir or Path("runs") / f"report-{experiment_name}"),
    )
    return _finish(report, client, None)
