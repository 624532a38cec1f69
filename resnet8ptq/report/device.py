"""The report's section for sweeps with device runs (`device=integer|cim`): accuracy on the device beside
the reference, a map over the two crossbar settings the sweep varies most, accuracy against weight noise."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.drawing import draw
from resnet8ptq.report.figures import DEVICE_NOISE_PNG, accuracy_map_png, device_noise_png
from resnet8ptq.report.runs import DEVICE_SETTINGS, configured
from resnet8ptq.report.sections import Report, Table

DEVICE_MAP_PNG = "report_device_map.png"
SQNR_IMAGES = 200  # as resnet8ptq.device.evaluate.SQNR_IMAGES (not imported: it loads torch)
MAP_AXES = ("adc_bits", "rows", "dac_bits", "bits_per_cell", "cells_per_weight", "accumulator_bits")
"""Settings a device map can span (numbers; weight noise has its own chart)."""


def device_section(report: Report) -> list[str]:
    """Accuracy of every device run beside its model's reference accuracy; the map and the noise chart where
    the sweep varies those settings."""
    table = configured(report.table)
    runs = table[table["device"] != ""].copy()
    if runs.empty:
        return []
    runs["model"] = runs["config"].str.replace(r" @\S+$", "", regex=True)
    rows = [
        [
            row.model,
            row.device,
            f"{100 * row.accuracy:.2f}",
            f"{100 * row.accuracy_device:.2f} ({100 * row.accuracy_device_ci_low:.2f}-"
            f"{100 * row.accuracy_device_ci_high:.2f})",
            f"{100 * row.accuracy_device_std:.2f}" if row.accuracy_device_std else "",
            f"{int(row.device_differing_predictions)}",
            row.device_worst_layer,
        ]
        for row in runs.sort_values(["model", "accuracy_device"], ascending=[True, False]).itertuples()
    ]
    headers = [
        "model",
        "device",
        "reference %",
        "on device % (95% CI)",
        "std over draws",
        "predictions differ",
        "worst layer (SQNR vs the integer device)",
    ]
    section = [
        "## On the device",
        "Accuracy of each quantized model on the device model (docs/device.md) beside its reference "
        "accuracy; `predictions differ`: test images whose class differs from the reference's (first draw); "
        f"worst layer: the lowest SQNR of its outputs against the integer device ({SQNR_IMAGES} images).",
        Table(headers, rows).markdown(),
    ]
    return section + device_map(report, runs) + noise_chart(report, runs)


def device_map(report: Report, runs: pd.DataFrame) -> list[str]:
    """Accuracy on the device over the first two crossbar settings of :data:`MAP_AXES` the sweep varies (ADC
    bits × rows, typically), one panel per model and per value of the other settings."""
    crossbar = runs[runs["device"].str.startswith("cim")]
    varied = [s for s in MAP_AXES if crossbar[f"device_{s}"].nunique() > 1]  # in MAP_AXES's order
    if len(varied) < 2:
        return []
    x, y = (f"device_{s}" for s in varied[:2])
    others = [f"device_{s}" for s in DEVICE_SETTINGS if f"device_{s}" not in (x, y)]
    maps, marks = {}, {}
    for key, group in crossbar.groupby(["model", *others], dropna=False, sort=True):
        title = key[0] + "".join(
            f", {name.removeprefix('device_')}={value:g}"
            if isinstance(value, float)
            else f", {name.removeprefix('device_')}={value}"
            for name, value in zip(others, key[1:], strict=True)
            if pd.notna(value) and crossbar[name].nunique() > 1
        )
        cells = group.drop_duplicates([x, y]).set_index([y, x])["accuracy_device"] * 100
        grid = cells.unstack()
        grid.index = [_axis(v) for v in grid.index]
        grid.columns = [_axis(v) for v in grid.columns]
        if grid.notna().to_numpy().sum() < 2:
            continue  # a single configuration: nothing to map
        maps[title] = grid
        marks[title] = grid.map(lambda _: "")
    if not maps:
        return []
    path = report.out_dir / DEVICE_MAP_PNG
    labels = (varied[0].replace("_", " "), varied[1].replace("_", " "))
    drawing = draw(accuracy_map_png, maps, marks, path, labels, "Accuracy on the device (%; grey: not run)")
    lines = [f"Accuracy on the device (%) over {labels[0]} × {labels[1]}:"]
    for title, grid in maps.items():
        headers = [f"{labels[1]} \\ {labels[0]}", *map(str, grid.columns)]
        body = [
            [str(index), *(f"{v:.1f}" if pd.notna(v) else "-" for v in row)] for index, row in grid.iterrows()
        ]
        lines += [f"**{title}**", Table(headers, body).markdown()]
    return [report.image(path, "accuracy on the device map", drawing), *lines]


def noise_chart(report: Report, runs: pd.DataFrame) -> list[str]:
    """Accuracy against the weight noise σ with its interval, when the sweep varies σ."""
    crossbar = runs[runs["device"].str.startswith("cim")]
    if crossbar["device_weight_noise"].nunique() < 2:
        return []
    curves = {}
    others = [f"device_{s}" for s in DEVICE_SETTINGS if s != "weight_noise"]
    for key, group in crossbar.groupby(["model", *others], dropna=False, sort=True):
        if group["device_weight_noise"].nunique() < 2:
            continue  # a point, not a curve (e.g. the noiseless cells of an ADC map)
        ordered = group.sort_values("device_weight_noise")
        label = key[0] + (
            f" @{ordered['device'].iloc[0].split('-n')[0]}" if ordered["device"].iloc[0] else ""
        )
        curves[label] = pd.DataFrame(
            {
                "sigma": ordered["device_weight_noise"],
                "accuracy": 100 * ordered["accuracy_device"],
                "low": 100 * ordered["accuracy_device_ci_low"],
                "high": 100 * ordered["accuracy_device_ci_high"],
            }
        )
    if not curves:
        return []
    fp32 = report.table.loc[~report.table["quantized"], "accuracy"]
    lines = {"FP32": 100 * float(fp32.max())} if len(fp32) else {}
    lines["reference"] = 100 * float(crossbar["accuracy"].max())
    integer = runs.loc[runs["device"] == "int", "accuracy_device"]
    if len(integer):
        lines["integer device"] = 100 * float(integer.max())
    path = report.out_dir / DEVICE_NOISE_PNG
    drawing = draw(device_noise_png, curves, lines, path)
    return [report.image(path, "accuracy against weight noise", drawing)]


def _axis(value: object) -> str:
    """A map axis value: an integer setting as an integer, unset (ideal) as `ideal`."""
    return "ideal" if pd.isna(value) else f"{value:g}"
