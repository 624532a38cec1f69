"""The report's section for sweeps with device runs (`device=integer|cim`): accuracy on the device beside
the reference, a map over the two crossbar settings the sweep varies most, accuracy against each effect
setting the sweep varies (weight noise, time since programming, read noise, stuck cells, ADC errors)."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.drawing import draw
from resnet8ptq.report.figures import DEVICE_NOISE_PNG, accuracy_map_png, device_curve_png
from resnet8ptq.report.runs import DEVICE_SETTINGS, configured, differing_note, without_device
from resnet8ptq.report.sections import Report, Table

DEVICE_MAP_PNG = "report_device_map.png"
SQNR_IMAGES = 200  # as resnet8ptq.device.evaluate.SQNR_IMAGES (not imported: it loads torch)
MAP_AXES = ("adc_bits", "rows", "dac_bits", "bits_per_cell", "cells_per_weight", "accumulator_bits")
"""Settings a device map can span (numbers; the effects have their own charts, :data:`CURVES`)."""


def device_section(report: Report) -> list[str]:
    """Accuracy of every device run beside its model's reference accuracy; the map and the noise chart where
    the sweep varies those settings."""
    table = configured(report.table)
    runs = table[table["device"] != ""].copy()
    if runs.empty:
        return []
    runs["model"] = without_device(runs["config"])
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
        "accuracy; `predictions differ`: test images whose class differs from the reference's (first draw)"
        f"{differing_note(runs)}; worst layer: the lowest SQNR of its outputs against the integer device "
        f"({SQNR_IMAGES} images).",
        Table(headers, rows).markdown(),
    ]
    return section + device_map(report, runs) + effect_charts(report, runs)


def device_map(report: Report, runs: pd.DataFrame) -> list[str]:
    """Accuracy on the device over the first two crossbar settings of :data:`MAP_AXES` the sweep varies (ADC
    bits × rows, typically), one panel per model (plain and device-aware apart) and per value of the other
    settings; a cell with runs from several calibration seeds shows their mean, and ± their std."""
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
        cells = over_seeds(group, [y, x])
        grid, spread = (_ideal_first(cells[column].unstack()) for column in ("accuracy", "spread"))
        for frame in (grid, spread):
            frame.index = [_axis(v) for v in frame.index]
            frame.columns = [_axis(v) for v in frame.columns]
        if grid.notna().to_numpy().sum() < 2:
            continue  # a single configuration: nothing to map
        maps[title] = grid
        marks[title] = spread.map(lambda std: f"±{std:.1f}" if pd.notna(std) else "")
    if not maps:
        return []
    path = report.out_dir / DEVICE_MAP_PNG
    labels = (varied[0].replace("_", " "), varied[1].replace("_", " "))
    drawing = draw(accuracy_map_png, maps, marks, path, labels, "Accuracy on the device (%; grey: not run)")
    lines = [
        f"Accuracy on the device (%) over {labels[0]} × {labels[1]} (the mean over calibration seeds ± their "
        "std, where a model has several):"
    ]
    for title, grid in maps.items():
        headers = [f"{labels[1]} \\ {labels[0]}", *map(str, grid.columns)]
        body = []
        for index, row in grid.iterrows():
            with_spread = zip(row, marks[title].loc[index], strict=True)
            cells = [f"{v:.1f} {m}".rstrip() if pd.notna(v) else "-" for v, m in with_spread]
            body.append([str(index), *cells])
        lines += [f"**{title}**", Table(headers, body).markdown()]
    return [report.image(path, "accuracy on the device map", drawing), *lines]


CURVES = {
    "weight_noise": ("programming noise σ (fraction of a cell's range)", False),
    "t_inference": ("time since programming, t_inference (s)", True),
    "read_noise": ("read noise σ (fraction of a cell's range)", False),
    "stuck_off": ("cells stuck at the lowest level (fraction)", False),
    "stuck_on": ("cells stuck at the highest level (fraction)", False),
    "adc_offset": ("ADC offset σ (LSB)", False),
    "adc_gain": ("ADC gain error σ (relative)", False),
    "adc_inl": ("ADC INL at mid-window (LSB)", False),
    "adc_noise": ("noise at the ADC's input σ (LSB)", False),
}
"""Effect settings a sweep can trace accuracy over (docs/device.md): the axis label, and whether the axis is
logarithmic (time: 1 hour to 10 years)."""


def effect_charts(report: Report, runs: pd.DataFrame) -> list[str]:
    """For each setting of :data:`CURVES` the sweep varies: accuracy on the device against it, one curve per
    model and per value of the other settings, with the interval over the noise draws; and its table."""
    crossbar = runs[runs["device"].str.startswith("cim")]
    fp32 = report.table.loc[~report.table["quantized"], "accuracy"]
    lines = {"FP32": 100 * float(fp32.max())} if len(fp32) else {}
    lines["reference"] = 100 * float(crossbar["accuracy"].max())
    integer = runs.loc[runs["device_config"] == "int", "accuracy_device"]
    if len(integer):
        lines["integer device"] = 100 * float(integer.max())
    section: list[str] = []
    for setting, (axis, log) in CURVES.items():
        column = f"device_{setting}"
        if column not in crossbar or crossbar[column].nunique() < 2:
            continue
        curves = effect_curves(crossbar, setting)
        if not curves:
            continue
        path = report.out_dir / effect_png(setting)
        drawing = draw(device_curve_png, curves, lines, path, axis, log)
        section.append(report.image(path, f"accuracy against {setting}", drawing))
        section += [f"Accuracy on the device (%, mean over the noise draws) against `{setting}`:"]
        section.append(curve_table(curves, setting).markdown())
    return section


def effect_png(setting: str) -> str:
    """The chart's file: ``report_device_noise.png`` for the programming noise (its name before the other
    effects came), ``report_device_<setting>.png`` for the others."""
    return DEVICE_NOISE_PNG if setting == "weight_noise" else f"report_device_{setting}.png"


def effect_curves(crossbar: pd.DataFrame, setting: str) -> dict[str, pd.DataFrame]:
    """Accuracy (%, with its interval) against ``setting``, one curve per model (plain and device-aware
    apart) and per value of the other settings, labelled by the settings that differ between the curves; a
    point with runs from several calibration seeds is their mean, its band spans every run's interval."""
    column = f"device_{setting}"
    others = [f"device_{s}" for s in DEVICE_SETTINGS if s != setting]
    groups = [
        (dict(zip(["model", *others], key, strict=True)), group)
        for key, group in crossbar.groupby(["model", *others], dropna=False, sort=True)
        if group[column].nunique() > 1  # else a point, not a curve (e.g. the noiseless cells of an ADC map)
    ]
    differing = [name for name in others if len({_axis(values[name]) for values, _ in groups}) > 1]
    curves = {}
    for values, group in groups:
        points = over_seeds(group, [column])
        label = values["model"] + "".join(
            f", {name.removeprefix('device_')}={_axis(values[name])}" for name in differing
        )
        curves[label] = pd.DataFrame(
            {
                "x": points.index.astype(float),
                "accuracy": points["accuracy"],
                "low": points["low"],
                "high": points["high"],
            }
        ).reset_index(drop=True)
    return curves


def over_seeds(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One model's device runs per value of ``keys`` (its runs over calibration seeds): their mean accuracy
    (%), the std over the seeds (NaN for one run), and the lowest and highest end of their intervals."""
    grouped = runs.groupby(keys, dropna=False, sort=True)
    return pd.DataFrame(
        {
            "accuracy": 100 * grouped["accuracy_device"].mean(),
            "spread": 100 * grouped["accuracy_device"].std(),
            "low": 100 * grouped["accuracy_device_ci_low"].min(),
            "high": 100 * grouped["accuracy_device_ci_high"].max(),
        }
    )


def curve_table(curves: dict[str, pd.DataFrame], setting: str) -> Table:
    """The curves as a table: one row per curve, one column per value of ``setting``."""
    xs = sorted({x for curve in curves.values() for x in curve["x"]})
    rows = []
    for label, curve in curves.items():
        at = dict(zip(curve["x"], curve["accuracy"], strict=True))
        rows.append([label, *(f"{at[x]:.2f}" if x in at else "-" for x in xs)])
    return Table([f"configuration \\ {setting}", *(f"{x:g}" for x in xs)], rows)


def _ideal_first(grid: pd.DataFrame) -> pd.DataFrame:
    """``grid`` with its unset (ideal) row and column first, then the values in order."""
    return grid.sort_index(na_position="first").sort_index(axis=1, na_position="first")


def _axis(value: object) -> str:
    """A setting's value as a map axis or a curve's label shows it: a number without trailing zeros, unset
    (ideal) as `ideal`, a choice or a flag as it is."""
    if isinstance(value, bool | str):
        return str(value)
    return "ideal" if pd.isna(value) else f"{value:g}"
