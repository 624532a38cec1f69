"""Report sections of accuracy-aware search: an Optuna search's trials and Pareto front (from the sweep run's
`search.*` tags), the steps of each mixed-precision search (runs grouped by their start configuration), and
budgeted mixes against uniform widths (accuracy vs bit operations and weight memory)."""

from __future__ import annotations

import re

import pandas as pd

from resnet8ptq.drawing import draw
from resnet8ptq.report.analysis import fmt, fmt_p, pareto_mask
from resnet8ptq.report.figures import (
    BUDGET_MEASURES,
    BUDGET_PNG,
    MIXED_PRECISION_PNG,
    SEARCH_PNG,
    budget_png,
    mixed_precision_png,
    search_png,
)
from resnet8ptq.report.runs import configured
from resnet8ptq.report.sections import Report, Table
from resnet8ptq.search.objectives import REFUSED, TRIAL_TAG_PREFIX
from resnet8ptq.search.target import TAG_PREFIX as MIXED_TAG_PREFIX

OBJECTIVE_DISPLAY = {
    "accuracy": ("accuracy (%)", 100.0, ".2f"),
    "model_size_bytes": ("size (KiB)", 1 / 1024, ".1f"),
    "throughput_img_s": ("throughput (img/s)", 1.0, ".0f"),
    "latency_ms_b1": ("latency b1 (ms)", 1.0, ".3f"),
    "accuracy_device": ("on device (%)", 100.0, ".2f"),
    "device_energy_uj": ("energy (µJ)", 1.0, ".3g"),
    "device_area_mm2": ("chip area (mm²)", 1.0, ".3g"),
    "device_latency_us": ("chip latency (µs)", 1.0, ".3g"),
}
"""Objective -> (column title, scale, format) as the report shows it."""


CI_COLUMNS = ["ci_low_pct", "ci_high_pct"]


def _interval(row) -> str:
    """The compared accuracy's 95% interval in percent (on the device for a device run), as the comparison
    table shows it."""
    return f"{fmt(row.ci_low_pct, '.2f')}-{fmt(row.ci_high_pct, '.2f')}"


def search_section(report: Report) -> list[str]:
    """The trials of an Optuna search (hydra/sweeper=search) in trial order with their objective values, the
    Pareto-optimal ones marked (the best one with a single objective), and their plot."""
    tags = report.parent_tags
    if "search.objectives" not in tags:
        return []
    objectives = tags["search.objectives"].split(",")
    maximize = [direction == "maximize" for direction in tags["search.directions"].split(",")]
    by_run = report.table.drop_duplicates("run_id").set_index("run_id")
    rows, refused, unfinished = [], [], []
    for key in sorted(key for key in tags if key.startswith(TRIAL_TAG_PREFIX)):
        number, outcome = int(key.removeprefix(TRIAL_TAG_PREFIX)), tags[key]
        if outcome.startswith(REFUSED):
            refused.append(f"#{number}: {outcome.removeprefix(REFUSED)}")
        elif outcome not in by_run.index:
            unfinished.append(f"#{number} (run {outcome[:8]})")
        else:
            row = by_run.loc[outcome]
            values = row[[*objectives, *CI_COLUMNS]].to_dict()
            rows.append({"trial": number, "label": row["label"], "run_id": outcome, **values})
    directions = ", ".join(
        f"{o} ({'max' if up else 'min'}imize)" for o, up in zip(objectives, maximize, strict=True)
    )
    settings = (
        f"Objectives: {directions}; sampler {tags.get('search.sampler', '?')}, "
        f"{tags.get('search.n_trials', '?')} trials asked; space: `{tags.get('search.space', '?')}`."
    )
    section = ["## Optuna search", settings]
    if refused:
        section.append(f"Refused by the backend (failed trials, the search went on): {'; '.join(refused)}.")
    if unfinished:
        section.append(f"Trials without a finished run: {', '.join(unfinished)}.")
    if not rows:
        return [*section, "No trial finished."]
    trials = pd.DataFrame(rows)
    trials.attrs["maximize"] = maximize
    front = pareto_mask(trials[objectives].to_numpy(float), maximize)
    headers = ["trial", "configuration", *(OBJECTIVE_DISPLAY[o][0] for o in objectives), "accuracy 95% CI"]
    headers += ["Pareto", "run"]
    table_rows = [
        [
            f"#{row.trial}",
            row.label,
            *(fmt(getattr(row, o) * OBJECTIVE_DISPLAY[o][1], OBJECTIVE_DISPLAY[o][2]) for o in objectives),
            _interval(row),
            "yes" if optimal else "",
            row.run_id[:8],
        ]
        for row, optimal in zip(trials.itertuples(), front, strict=True)
    ]
    what = "Best trial" if len(objectives) == 1 else "Pareto front"
    named = ", ".join(f"#{row.trial} {row.label}" for row in trials[front].itertuples())
    summary = f"**{what}** ({int(front.sum())} of {len(trials)} trials): {named}."
    section += [summary, Table(headers, table_rows).markdown()]
    shown = trials.assign(**{o: trials[o] * OBJECTIVE_DISPLAY[o][1] for o in objectives})
    names = [OBJECTIVE_DISPLAY[o][0] for o in objectives]
    path = report.out_dir / SEARCH_PNG
    drawing = draw(search_png, shown, objectives, names, front, path)
    return [*section, report.image(path, "Optuna search: trials and Pareto front", drawing)]


def mixed_precision_section(report: Report) -> list[str]:
    """Each mixed-precision search (runs sharing a start configuration, `mixed_precision.base_hash`): its
    steps in order with the layers each raised, accuracy, drop, size and speed; its outcome; and a plot."""
    table = report.table[report.table["quantized"]]
    starts = sorted(set(table["base_hash"]) - {""})
    if not starts:
        return []
    outcomes = {
        key.removeprefix(MIXED_TAG_PREFIX): value
        for key, value in report.parent_tags.items()
        if key.startswith(MIXED_TAG_PREFIX)
    }
    section = [
        "## Mixed precision",
        "Each step raises the layers with the lowest SQNR in the previous step's per-layer analysis to 16 "
        "bits (layers that take another's quantization follow it); the result is the first step within the "
        "target.",
    ]
    plotted: dict[str, tuple[pd.DataFrame, float | None]] = {}
    for start in starts:
        steps = table[(table["base_hash"] == start) | (table["config_hash"] == start)]
        steps = steps.sort_values(["raised_count", "start_time"], kind="stable").drop_duplicates(
            "config_hash"
        )
        outcome = outcomes.get(start, "")
        found = re.match(r"target ([0-9.]+) points", outcome)
        target = float(found.group(1)) if found else None
        first = steps.iloc[0]
        title = first["label"] if first["raised_count"] == 0 else f"{first['backend']} search {start[:8]}"
        section.append(f"**{title}**: {outcome or 'no outcome recorded on this sweep run'}")
        section.append(_steps_table(steps, target).markdown())
        fp32 = first["accuracy_pct"] - first["delta_points"]
        plotted[title] = (steps, None if target is None else fp32 - target)
    path = report.out_dir / MIXED_PRECISION_PNG
    drawing = draw(mixed_precision_png, plotted, path)
    return [*section, report.image(path, "mixed precision: accuracy by step", drawing)]


def _steps_table(steps: pd.DataFrame, target: float | None) -> Table:
    """One row per step: the layers it added (read back from the saved model), accuracy, drop, size, speed."""
    rows, before = [], set()
    for number, row in enumerate(steps.itertuples()):
        raised = {name for name in row.raised.split(",") if name}
        added = ", ".join(sorted(raised - before)) or "—"
        before = raised
        drop = -row.delta_points
        within = "—" if target is None else ("yes" if round(drop, 6) <= target else "no")
        rows.append(
            [
                str(number),
                str(row.raised_count),
                added,
                fmt(row.accuracy_pct, ".2f"),
                _interval(row),
                fmt(drop, ".2f"),
                fmt_p(row.p_vs_fp32_holm),
                within,
                fmt(row.size_kib, ".1f"),
                fmt(row.throughput_img_s, ".0f"),
                fmt(row.latency_ms_b1, ".3f"),
                row.run_id[:8],
            ]
        )
    headers = [
        "step", "16-bit layers", "raised in this step", "accuracy (%)", "95% CI", "drop (points)",
        "p vs FP32", "within target", "size (KiB)", "throughput (img/s)", "latency b1 (ms)", "run",
    ]  # fmt: skip
    return Table(headers, rows) if rows else Table(headers, [["—"] * len(headers)])


def budget_section(report: Report) -> list[str]:
    """Budgeted mixes (`target.max_bops`/`max_weight_bits`) beside the uniform-width runs of the report:
    accuracy, bit operations and weight memory of each, whether it is on its backend's Pareto front (fewer
    BOPs, higher accuracy), and the plot."""
    table = configured(report.table)
    runs = table[table["bops"].notna() & (table["raised_count"] == 0)]
    if not (runs["budget"] != "").any():
        return []
    runs = runs.sort_values(["backend", "bops", "accuracy_pct"], ascending=[True, True, False])
    fronts = {
        measure: pd.concat(
            pd.Series(
                pareto_mask(group[[measure, "accuracy_pct"]].to_numpy(float), [False, True]), group.index
            )
            for _, group in runs.groupby("backend")
        )
        for measure in BUDGET_MEASURES
    }
    rows = [
        [
            row.label,
            row.budget or "uniform",
            fmt(row.bops / 1e6, ".1f"),
            fmt(row.weight_memory_bits / 1e3, ".1f"),
            fmt(row.accuracy_pct, ".2f"),
            _interval(row),
            fmt(-row.delta_points, ".2f"),
            fmt_p(row.p_vs_fp32_holm),
            "yes" if fronts["bops"][row.Index] else "",
            row.layer_bits or "—",
            row.run_id[:8],
        ]
        for row in runs.itertuples()
    ]
    headers = [
        "configuration", "budget", "MBOPs", "weight memory (kbit)", "accuracy (%)", "95% CI", "drop (points)",
        "p vs FP32", "Pareto (BOPs)", "own widths (read back)", "run",
    ]  # fmt: skip
    section = [
        "## Mixed precision under a budget",
        "Each budgeted mix gives every layer the width of least predicted error within the budget (per-layer "
        "sensitivity on the calibration sample, an integer program; `analysis/sensitivity.csv` of its run). "
        "BOPs: multiply-accumulates x weight bits x input bits, per image; weight memory: conv/gemm weights "
        "only. Pareto: no run of the same backend has fewer BOPs and a higher accuracy.",
        Table(headers, rows).markdown(),
    ]
    path = report.out_dir / BUDGET_PNG
    drawing = draw(budget_png, runs, fronts, path)
    return [*section, report.image(path, "accuracy vs budget: uniform widths and budgeted mixes", drawing)]
