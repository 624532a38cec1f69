"""The report's sections as Markdown: each function returns the Markdown paragraphs of one section (tables,
bullets, images beside the report) computed from the comparison table."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from resnet8ptq.drawing import Drawing, draw
from resnet8ptq.execution import NATIVE_MISMATCH, mismatch_cause
from resnet8ptq.markdown import Table
from resnet8ptq.report.analysis import (
    SIZE_TOLERANCE,
    THROUGHPUT_TOLERANCE,
    class_deltas,
    costed,
    fmt,
    fmt_p,
    machine_names,
    pareto_front,
    recommendations,
    worst_classes,
)
from resnet8ptq.report.figures import (
    AREA_PNG,
    ENERGY_PNG,
    HEATMAP_PNG,
    SIZE_PNG,
    THROUGHPUT_PNG,
    class_delta_heatmap_png,
    tradeoff_png,
)
from resnet8ptq.report.published_energy import energy_references
from resnet8ptq.report.runs import accuracy_name, compared_note, configured
from resnet8ptq.report.significance import seed_spread
from resnet8ptq.statistics import significant
from resnet8ptq.tracking import schema


def bullets(items: list[str]) -> str:
    """A Markdown bullet list."""
    return "\n".join(f"- {item}" for item in items)


@dataclass
class Report:
    """What a report shows, computed from the runs; its figures are written into ``out_dir``."""

    title: str
    context: list[str]
    table: pd.DataFrame
    failed: pd.DataFrame
    max_drop_points: float
    out_dir: Path
    chip_drop_points: float = 1.0  # the cheapest chip's limit against the integer device (ReportConfig)
    images: list[Drawing] = field(default_factory=list)
    parent_tags: dict[str, str] = field(default_factory=dict)  # the sweep run's (search.*, mixed_precision.*)

    @property
    def has_results(self) -> bool:
        """Whether at least one quantized run finished."""
        return bool(self.table["quantized"].any()) if len(self.table) else False

    def image(self, path: Path, alt: str, drawing: Drawing) -> str:
        """Markdown for a figure being drawn into ``path`` beside the report (``drawing``, remembered to log
        and embed the file)."""
        self.images.append(drawing)
        return f"![{alt}]({path.name})"


def comparison_rows(table: pd.DataFrame, max_drop_points: float) -> Table:
    """The comparison table, one row per finished run; with device runs, the reference accuracy beside the
    accuracy on the device."""
    device = bool(table["on_device"].any())
    headers = [
        "configuration",
        "backend",
        "dtype",
        "act/weight",
        "calib",
        "per-channel",
        f"{accuracy_name(table)} (%)",
        "95% CI (%)",
        *(["reference (%)"] if device else []),
        "MLPerf perf subset (%)",
        "Δ vs FP32 (points)",
        "p vs FP32",
        "size (KiB)",
        "size reduction",
        "throughput (img/s)",
        "latency b1 (ms)",
        "execution",
        "native (%)",
        "kernel gap (points)",
    ]
    machines = machine_names(table)
    headers += ["machine"] if len(machines) > 1 else []
    headers.append("run")
    rows = []
    for row in table.itertuples():
        over = row.quantized and round(row.delta_points, 6) < -max_drop_points  # exactly at the limit: within
        rows.append(
            [
                row.label,
                row.backend,
                row.dtype,
                f"{row.activation}/{row.weight}",
                row.calib or "—",
                row.per_channel or "—",
                fmt(row.accuracy_pct, ".2f"),
                f"{fmt(row.ci_low_pct, '.2f')}-{fmt(row.ci_high_pct, '.2f')}",
                *([fmt(row.reference_pct, ".2f")] if device else []),
                fmt(row.perf_subset_pct, ".1f"),
                fmt(row.delta_points, "+.2f", " ⚠" if over else ""),
                fmt_p(row.p_vs_fp32_holm) if row.quantized else "—",
                fmt(row.size_kib, ".1f"),
                fmt(row.size_reduction, ".2f", "x"),
                fmt(row.throughput_img_s, ".0f"),
                fmt(row.latency_ms_b1, ".3f"),
                row.execution or "—",
                fmt(row.accuracy_native * 100, ".2f") if np.isfinite(row.accuracy_native) else "—",
                fmt(row.kernel_gap_points, "+.2f") if np.isfinite(row.kernel_gap_points) else "—",
                *([machines[row.hardware]] if len(machines) > 1 else []),
                row.run_id[:8],
            ]
        )
    return Table(headers, rows)


def failed_rows(failed: pd.DataFrame) -> Table:
    """Runs that did not finish, with their status and error."""
    rows = [
        [row.label, row.run_name, row.status, (row.error or "(no error recorded)")[:400], row.run_id[:8]]
        for row in failed.sort_values(["backend", "label"]).itertuples()
    ]
    return Table(["configuration", "run name", "status", "error", "run"], rows)


def recommendation_section(table: pd.DataFrame, limit: float) -> list[str]:
    """The picks as bullets, then the configurations over the accuracy-drop limit."""
    picks, over = recommendations(table, limit)
    items = [f"**{pick.what}**: {pick.label} — {pick.detail}" for pick in picks]
    over_text = ", ".join(f"{r.label} ({r.delta_points:+.2f} points)" for r in over.itertuples())
    items.append(f"**Accuracy drop over {limit:g} points**: {over_text or 'none'}")
    ties = best_ties_line(table)
    items += [ties] if ties else []
    device = compared_note(table)
    scope = (
        f"among the configurations within the {limit:g}-point limit"
        if len(over) < len(configured(table))
        else f"among all configurations (none is within the {limit:g}-point limit)"
    )
    note = (
        f"Smallest and fastest are chosen {scope}; sizes within {SIZE_TOLERANCE:.0%} and throughputs within "
        f"{THROUGHPUT_TOLERANCE:.0%} count as ties, won by the more accurate."
    )
    if configured(table)["device_energy_uj"].notna().any():
        note += (
            " A device run whose chip was costed is judged by its chip (energy, area and latency per "
            "inference from its component models: [chip](#the-chip)), the others by the model file and this "
            "CPU's speed."
        )
    return ["## Recommendations", *([device] if device else []), bullets(items), note]


def execution_section(table: pd.DataFrame) -> list[str]:
    """Reference vs native accuracy of the runs whose integer kernels ran, with the cause of each mismatch,
    then how the other configurations executed."""
    quantized = table[table["quantized"] & (table["execution"].fillna("") != "")].fillna(
        {"execution_reason": ""}
    )
    if quantized.empty:
        return []
    section = [
        "## Reference and native execution",
        "`accuracy` is the reference semantics (the quantized model's exact arithmetic: its "
        "quantize/dequantize semantics, or for an integer-only TFLite model LiteRT's reference kernels). "
        "LiteRT's reference kernels and the integer device compute in integers: the same on every CPU for "
        "the same model bytes. ONNX Runtime's and PyTorch's reference passes run the CPU's float kernels, "
        "whose rounding can move a few predictions between CPU kinds. ONNX Runtime and PyTorch calibrate "
        "in float64, so their ranges and models do not follow the float kernels' order of summation; "
        "TFLite's converter and the learned algorithms (AdaRound, BRECQ, QDrop) compute in float32, so "
        "their models can differ between machines: compare the runs' `digest.*` tags "
        "(`python -m resnet8ptq.diff RUN_A RUN_B`). Where the runtime runs integer kernels, their accuracy "
        "on this CPU is measured too: `native` when it matches the reference within the tolerance, "
        "`native-mismatch` when it does not.",
    ]
    kernels = quantized[quantized["kernel_gap_points"].notna()]
    machines = machine_names(table)
    if len(kernels):
        rows = [
            [
                r.label,
                machines[r.hardware] if len(machines) > 1 else r.hardware,
                f"{r.accuracy * 100:.2f}",
                f"{r.accuracy_native * 100:.2f}",
                f"{r.kernel_gap_points:+.2f}",
                r.execution,
            ]
            for r in kernels.sort_values(["hardware", "label"]).itertuples()
        ]
        headers = ["configuration", "machine", "reference (%)", "native (%)", "gap (points)", "execution"]
        section.append(Table(headers, rows).markdown())
    causes: dict[str, list[str]] = {}
    for r in quantized[quantized["execution"] == NATIVE_MISMATCH].itertuples():
        if r.int8_dot_product is None:
            cause = "the machine was not recorded"
        else:
            cause = mismatch_cause(bool(r.int8_dot_product), (r.activation, r.weight))
        causes.setdefault(cause, []).append(r.label)
    simulated = quantized[quantized["kernel_gap_points"].isna()]
    items = [f"**native-mismatch** ({', '.join(labels)}): {cause}" for cause, labels in causes.items()]
    items += [
        f"**{execution}** ({reason or 'no reason recorded'}): {', '.join(group['label'])}"
        for (execution, reason), group in simulated.groupby(["execution", "execution_reason"], sort=True)
    ]
    return section + ([bullets(items)] if items else [])


def per_class_section(report: Report) -> list[str]:
    """The classes that lose the most, and the heatmap of every class under every configuration."""
    deltas = class_deltas(report.table)
    if deltas.empty:
        return []
    section = ["## Per-class accuracy"]
    worst = worst_classes(deltas)
    if len(worst):
        top = worst.iloc[0]
        section.append(
            f"Most affected: **{top['class']} {top['worst_points']:+.1f} points under {top['config']}**."
        )
        rows = [
            [r["class"], f"{r['worst_points']:+.1f}", r["config"], f"{r['mean_points']:+.2f}"]
            for r in worst.to_dict("records")
        ]
        headers = ["class", "worst Δ (points)", "under", "mean Δ over configs (points)"]
        section.append(Table(headers, rows).markdown())
    else:
        section.append("No class loses accuracy under any configuration.")
    heatmap = report.out_dir / HEATMAP_PNG
    drawing = draw(class_delta_heatmap_png, deltas, heatmap)
    section.append(report.image(heatmap, "per-class accuracy change vs FP32", drawing))
    return section


def layer_error_section(table: pd.DataFrame) -> list[str]:
    """The worst layer of each configuration (per-layer SQNR against FP32; every layer in analysis/)."""
    quantized = table[table["quantized"] & (table["sqnr_worst_layer"].fillna("") != "")]
    if quantized.empty:
        return []
    quantized = quantized.sort_values("sqnr_activation_min_db", na_position="last")
    rows = [
        [r.label, f"{r.sqnr_activation_min_db:.1f}", f"{r.sqnr_weight_min_db:.1f}", r.sqnr_worst_layer]
        for r in quantized.itertuples()
    ]
    note = (
        "Signal-to-quantization-noise ratio of each layer against the FP32 model on calibration images "
        "(higher is better; every 6 dB is one bit). Each run's `analysis/layer_sqnr.csv` and "
        "`layer_sqnr.png` list every layer."
    )
    header = ["configuration", "min activation SQNR (dB)", "min weight SQNR (dB)", "worst layer"]
    return ["## Per-layer error (worst layers)", note, Table(header, rows).markdown()]


def added_stage_section(table: pd.DataFrame) -> list[str]:
    """The metrics of the stages added as modules (:mod:`resnet8ptq.stages`), one column each, for the
    runs that logged any, with the meanings the stages declare."""
    declared = schema.stage_names("metric")
    present = [name for name in declared if name in table and table[name].notna().any()]
    if not present:
        return []
    logged = table[table[present].notna().any(axis=1)]
    rows = [
        [row["label"], *("—" if pd.isna(row[name]) else f"{row[name]:.4g}" for name in present)]
        for _, row in logged.iterrows()
    ]
    note = "Logged by stages added as modules: " + "; ".join(f"`{n}`: {declared[n]}" for n in present) + "."
    return ["## Added stages", note, Table(["configuration", *present], rows).markdown()]


def tradeoff_section(report: Report) -> list[str]:
    """Accuracy vs size and vs throughput (per machine: speed compares only within one), and for device
    runs whose chip was costed, vs the chip's energy (MLPerf Tiny's published systems beside it) and area
    instead, with the Pareto-optimal configurations named."""
    section = ["## Trade-offs"]
    chips = costed(report.table)
    files = report.table.drop(report.table.index[report.table["run_id"].isin(chips["run_id"])])
    if not configured(files).empty:
        section += _file_tradeoffs(report, files)
    accuracy = accuracy_name(report.table)
    panels = [
        ("device_energy_uj", "energy per inference on the chip (µJ)", ENERGY_PNG, f"{accuracy} vs the chip's "
         "energy", energy_references(chips)),
        ("device_area_mm2", "the chip's area (mm²)", AREA_PNG, f"{accuracy} vs the chip's area", ()),
    ]  # fmt: skip
    for x, x_label, png, what, references in panels if len(chips) else ():
        section += _tradeoff(report, chips, (x, x_label, True, png, what), references)
    references = energy_references(chips)
    if references:
        section.append(
            "Dotted: MLPerf Tiny's published median energy per inference of this model on whole systems "
            "(memories and data movement included; each cited in resnet8ptq/report/published_energy.py), "
            + ", ".join(f"{name} {energy:g} µJ" for name, energy in references)
            + "."
        )
    return section


def _file_tradeoffs(report: Report, table: pd.DataFrame) -> list[str]:
    """Accuracy vs the model file's size and vs this CPU's throughput (per machine) of the runs that have
    no costed chip."""
    machines = machine_names(table)
    accuracy = accuracy_name(report.table)
    panels = [("size_kib", "model size (KiB)", True, SIZE_PNG, f"{accuracy} vs model size", table)]
    for label, short in machines.items():
        png = THROUGHPUT_PNG if len(machines) == 1 else THROUGHPUT_PNG.replace(".png", f"_{short}.png")
        what = f"{accuracy} vs throughput" + (f" on {short} ({label})" if len(machines) > 1 else "")
        rows = table[table["hardware"] == label]
        panels.append(("throughput_img_s", "throughput (img/s)", False, png, what, rows))
    return [line for *axis, rows in panels for line in _tradeoff(report, rows, tuple(axis))]


def _tradeoff(
    report: Report, rows: pd.DataFrame, axis: tuple, references: tuple[tuple[str, float], ...] = ()
) -> list[str]:
    """One trade-off chart (``axis``: column, its label, whether less is better, file, what it shows) with
    its Pareto front named."""
    x, x_label, minimize, png, what = axis
    points = rows.dropna(subset=[x, "accuracy_pct"]).reset_index(drop=True)
    if points.empty:
        return []
    front = pareto_front(points[x].to_numpy(), points["accuracy_pct"].to_numpy(), minimize_x=minimize)
    line = f"Pareto front, {what}: **" + ", ".join(points.loc[front, "label"]) + "**."
    title = f"{what[0].upper()}{what[1:]} (Pareto front ringed)"
    path = report.out_dir / png
    drawing = draw(tradeoff_png, points, (x, x_label), front, path, title, references)
    return [line, report.image(path, what, drawing)]


def nothing_to_report_message(report: Report) -> str:
    """Why there is no comparison."""
    return (
        f"Nothing to report: no finished quantized run ({len(report.failed)} failed or unfinished, "
        f"{int((~report.table['quantized']).sum())} FP32 baseline(s) finished)."
    )


PAIRED_TEST = "exact McNemar test on the same test images, Holm-adjusted, alpha = 0.05"


def best_ties_line(table: pd.DataFrame) -> str | None:
    """Whether the most accurate configuration is significantly better than each other one (paired test)."""
    own = configured(table)
    tested = own[own["p_vs_best_holm"].notna()]
    if tested.empty:
        return None
    best = own.sort_values(["accuracy_pct", "label"], ascending=[False, True]).iloc[0]
    ties = tested[~tested["p_vs_best_holm"].map(significant)].sort_values("accuracy_pct", ascending=False)
    if ties.empty:
        return (
            f"**Is the best really best?** Yes: {best['label']} is significantly more accurate than every "
            f"other configuration ({PAIRED_TEST})."
        )
    names = [
        f"{r.label} ({r.accuracy_pct:.2f}%, p {fmt_p(r.p_vs_best_holm)})" for r in ties.head(8).itertuples()
    ]
    more = f" and {len(ties) - 8} more" if len(ties) > 8 else ""
    return (
        f"**Is the best really best?** Not distinguishable from {len(ties)} of the other {len(tested)} "
        f"configurations ({PAIRED_TEST}): {', '.join(names)}{more}."
    )


def significance_section(table: pd.DataFrame) -> list[str]:
    """Which accuracy differences are real: the interval every accuracy carries, each configuration against
    FP32 by a paired test, and the spread over calibration samples (`data.seed`) where the runs have it."""
    quantized = configured(table)
    widths = (quantized["ci_high_pct"] - quantized["ci_low_pct"]) / 2
    section = [
        "## Significance",
        f"Every accuracy carries its 95% Wilson interval (column `95% CI`; here ±{fmt(widths.min(), '.2f')} "
        f"to ±{fmt(widths.max(), '.2f')} points). Overlapping intervals do not settle a comparison: the "
        f"paired test ({PAIRED_TEST}) uses the images both models saw and is sharper.",
    ]
    if quantized["on_device"].any():
        section.append(
            "A device run is tested on the device's predictions (`device/predictions.csv`); one whose "
            "accuracy is a mean over noise draws that differ (`accuracy_device_std` > 0) is not tested: one "
            "draw's predictions do not stand for that mean, whose interval (over the draws) is in the table."
        )
    tested = quantized[quantized["p_vs_fp32_holm"].notna()]
    if tested.empty:
        section.append("No paired tests: these runs did not log their predictions (`predictions.csv`).")
    else:
        worse = tested["p_vs_fp32_holm"].map(significant) & (tested["delta_points"] < 0)
        better = tested["p_vs_fp32_holm"].map(significant) & (tested["delta_points"] > 0)
        same = tested[~worse & ~better]
        section.append(
            f"Against their backend's FP32 model: {int(worse.sum())} of {len(tested)} configurations are "
            f"significantly less accurate, {int(better.sum())} significantly more, and {len(same)} not "
            f"distinguishable" + (f": {', '.join(same['label'])}." if len(same) else ".")
        )
    spread = seed_spread(table)
    if len(spread):
        rows = [
            [r.config, str(r.seeds), f"{r.mean:.2f} ± {r.std:.2f}", f"{r.min:.2f}-{r.max:.2f}"]
            for r in spread.itertuples()
        ]
        headers = ["configuration", "seeds", "accuracy (%) mean ± std", "min-max (%)"]
        section += [
            "Over calibration samples (`data.seed`: another stratified sample of the training split each):",
            Table(headers, rows).markdown(),
        ]
    return section
