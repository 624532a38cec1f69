"""The report's chip section, for device runs whose chip was costed (resnet8ptq/components/,
docs/chip_cost.md): the cheapest chip (by energy, and by area) within a number of points of the ideal
integer device (the one by energy beside MLPerf Tiny's published systems for its benchmark), every chip's
energy, latency, area and efficiency with the Pareto-optimal ones marked, and where each chip's energy goes;
where a sweep ran depthwise layers both on crossbars and on the digital unit (``device.depthwise``), which
mapping is cheaper. The accuracy-vs-energy and accuracy-vs-area trade-offs are drawn with the others
(sections.py)."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.components.config import COMPONENTS
from resnet8ptq.device.config import DIGITAL_DEPTHWISE_LABEL
from resnet8ptq.drawing import draw
from resnet8ptq.report.analysis import chip_figures, costed, fmt, pareto_front, score
from resnet8ptq.report.figures import CHIP_ENERGY_PNG, chip_energy_png
from resnet8ptq.report.published_energy import published_line
from resnet8ptq.report.runs import configured, without_device
from resnet8ptq.report.sections import Report, Table
from resnet8ptq.report.suite import suite_section


def integer_accuracy(table: pd.DataFrame, model: str) -> tuple[float, str]:
    """The accuracy (%) of ``model`` on the ideal integer device, and where it comes from: its
    ``device=integer`` run in this report, else its reference accuracy (the same integer model in its
    toolchain's reference pass: a few predictions differ, docs/device.md)."""
    runs = configured(table)
    models = without_device(runs["config"])
    integer = runs[(models == model) & (runs["device_config"] == "int")]
    if len(integer):
        return float(integer["accuracy_pct"].max()), "its run on the integer device"
    same = runs[models == model]
    return float(100 * same["accuracy"].max()), "its reference accuracy (no integer-device run in the sweep)"


def chip_section(report: Report, drop_points: float) -> list[str]:
    """The cheapest chips within ``drop_points`` of the integer device, the chips' table and their energy by
    component."""
    runs = costed(report.table)
    if runs.empty:
        return []
    references = {model: integer_accuracy(report.table, model) for model in runs["model"].unique()}
    runs["reference_pct"] = runs["model"].map(lambda model: references[model][0])
    runs["vs_integer"] = runs["accuracy_pct"] - runs["reference_pct"]
    within = runs[runs["vs_integer"].round(6) >= -drop_points]
    section = ["## The chip", _source_line(runs)]
    picks = []
    several = runs["network"].nunique() > 1  # each network's own cheapest chip (one for all: suite.py)
    for network, own in within.groupby("network", sort=True):
        for what, column in (("energy", "device_energy_uj"), ("area", "device_area_mm2")):
            best = own.sort_values([column, "accuracy_pct"], ascending=[True, False], kind="stable").iloc[0]
            scope = f" for {network}" if several else ""
            accuracy = score(best)
            published = published_line(network, best["device_energy_uj"]) if what == "energy" else None
            picks.append(
                f"**Cheapest chip by {what}{scope} within {drop_points:g} point(s) of the integer device**: "
                f"{best['label']} — {accuracy} on the device ({best['vs_integer']:+.2f} points vs the "
                f"integer device), {chip_figures(best)}" + (f". {published}" if published else "")
            )
    if not picks:
        picks.append(f"**No chip keeps its accuracy within {drop_points:g} point(s) of the integer device.**")
    picks += target_picks(runs)
    origins = sorted({origin for _, origin in references.values()})
    section += ["- " + "\n- ".join(picks), "The integer device's accuracy: " + "; ".join(origins) + "."]
    section.append(_chip_table(runs).markdown())
    section += suite_section(runs, drop_points)
    section += depthwise_mapping(runs, drop_points)
    path = report.out_dir / CHIP_ENERGY_PNG
    title = "Energy per inference by component (hwcomponents models)"
    drawing = draw(chip_energy_png, runs, COMPONENTS, path, title)
    section.append(report.image(path, "energy per inference by component", drawing))
    return section


def target_picks(runs: pd.DataFrame) -> list[str]:
    """For each network with an MLPerf Tiny quality target (``model.quality_target``), the chip of least
    energy that reaches it, or that none does."""
    picks = []
    for network, own in runs.dropna(subset=["quality_target"]).groupby("network", sort=True):
        target = float(own["quality_target"].iloc[0])
        auc = own["metric"].eq("auc").any()
        shown = f"AUC {target:.2f}" if auc else f"{100 * target:g}% top-1"
        meeting = own[own["accuracy_pct"].round(6) >= round(100 * target, 6)]
        if meeting.empty:
            picks.append(f"**No chip of {network} reaches MLPerf Tiny's quality target ({shown}).**")
            continue
        best = meeting.sort_values(["device_energy_uj", "accuracy_pct"], ascending=[True, False]).iloc[0]
        picks.append(
            f"**Cheapest chip by energy for {network} at MLPerf Tiny's quality target ({shown})**: "
            f"{best['label']} — {score(best)} on the device, {chip_figures(best)}"
        )
    return picks


DIGITAL_LABEL = f"-{DIGITAL_DEPTHWISE_LABEL}"
"""What a run's label adds for ``device.depthwise=digital``."""


def depthwise_mapping(runs: pd.DataFrame, drop_points: float) -> list[str]:
    """For each chip costed with its depthwise layers both on crossbars and on the digital unit (the same
    configuration but ``device.depthwise``): a summary line (how many chips each mapping makes cheaper, and
    how many keep their accuracies within ``drop_points`` of each other) and a table of the pairs; empty
    without such a pair."""
    by_chip = runs.assign(chip=runs["label"].str.replace(DIGITAL_LABEL, "", regex=False))
    rows, digital_cheaper, close = [], {"energy": 0, "area": 0}, 0
    for chip, pair in by_chip.groupby("chip", sort=True):
        digital = pair["label"].str.contains(DIGITAL_LABEL, regex=False)
        if digital.all() or not digital.any():
            continue
        arrays, unit = pair[~digital].iloc[0], pair[digital].iloc[0]
        figures = ["accuracy_pct", "device_energy_uj", "device_area_mm2"]
        if arrays[figures].equals(unit[figures]):  # no grouped layer: both settings are the same chip
            continue
        gap = float(unit["accuracy_pct"] - arrays["accuracy_pct"])
        close += abs(gap) <= drop_points
        cheaper = {}
        for what, column in (("energy", "device_energy_uj"), ("area", "device_area_mm2")):
            on_unit = unit[column] < arrays[column]
            digital_cheaper[what] += on_unit
            cheaper[what] = "digital" if on_unit else "crossbar"
        used = fmt(100 * arrays.get("device_array_utilisation", float("nan")), ".3g")
        rows.append(
            [chip, _costed(arrays), used, _costed(unit), cheaper["energy"], cheaper["area"], f"{gap:+.2f}"]
        )
    if not rows:
        return []
    pairs = len(rows)
    summary = (
        f"**Depthwise layers on crossbars or on the digital unit** (`device.depthwise`), {pairs} chip(s) run "
        f"both ways: the digital unit costs less energy on {digital_cheaper['energy']}, less area on "
        f"{digital_cheaper['area']}; the two mappings' accuracies are within {drop_points:g} point(s) on "
        f"{close}."
    )
    headers = [
        "chip", "depthwise on crossbars", "array cells used %", "depthwise on the digital unit",
        "less energy", "less area", "digital - crossbar (points)",
    ]  # fmt: skip
    return [summary, Table(headers, rows).markdown()]


def _costed(row: pd.Series) -> str:
    """A chip's accuracy (or AUC), energy and area: ``71.86%, 0.461 µJ, 0.416 mm²``."""
    energy, area = fmt(row["device_energy_uj"], ".3g", " µJ"), fmt(row["device_area_mm2"], ".3g", " mm²")
    return f"{score(row)}, {energy}, {area}"


def _source_line(runs: pd.DataFrame) -> str:
    """The section's first line: what is costed, and the component models (with how many runs each, where
    the runs used several: the integer device asks no ADC model)."""
    tags = runs.get("cost_model", pd.Series(dtype=str)).dropna()
    counts = tags[tags != ""].value_counts().sort_index()
    models = [
        tag if len(counts) == 1 else f"{tag} ({count} run{'s' * (count > 1)})"
        for tag, count in counts.items()
    ]
    return (
        "Energy, latency and area of one inference on the chip each device run simulated, from its exact "
        "action counts and the Accelergy project's `hwcomponents` component models (docs/chip_cost.md); "
        "weight and activation memories, data movement and control are not costed"
        + (f". Models: {'; '.join(models)}." if models else ".")
    )


def _chip_table(runs: pd.DataFrame) -> Table:
    """Every chip with its figures; `*` on the accuracy-vs-energy and accuracy-vs-area Pareto fronts."""
    ordered = runs.sort_values("device_energy_uj").reset_index(drop=True)
    accuracy = ordered["accuracy_pct"].to_numpy()
    on_energy = pareto_front(ordered["device_energy_uj"].to_numpy(), accuracy, minimize_x=True)
    on_area = pareto_front(ordered["device_area_mm2"].to_numpy(), accuracy, minimize_x=True)
    rows = [
        [
            row.label,
            fmt(row.accuracy_pct, ".2f"),
            fmt(row.vs_integer, "+.2f"),
            fmt(row.device_energy_uj, ".3g") + (" *" if energy else ""),
            fmt(row.device_latency_us, ".3g"),
            fmt(row.device_area_mm2, ".3g") + (" *" if area else ""),
            fmt(row.device_tops_per_w, ".3g"),
            fmt(row.device_tops_per_mm2, ".3g"),
            fmt(100 * row.device_array_utilisation, ".3g"),
        ]
        for row, energy, area in zip(ordered.itertuples(), on_energy, on_area, strict=True)
    ]
    headers = [
        "configuration", "on device %", "vs integer device (points)", "energy (µJ)", "latency (µs)",
        "area (mm²)", "TOPS/W", "TOPS/mm²", "array cells used %",
    ]  # fmt: skip
    return Table(headers, rows)
