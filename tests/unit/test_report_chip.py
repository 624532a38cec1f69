"""The chip section (resnet8ptq/report/chip.py): for each chip swept with its depthwise layers on crossbars
and on the digital unit, the cheaper mapping in energy and in area and their accuracy gap (chips swept with
one mapping only are not compared); each network's cheapest chip at its MLPerf Tiny quality target."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.report.chip import DIGITAL_LABEL, depthwise_mapping, target_picks


def chips(*rows: tuple[str, float, float, float]) -> pd.DataFrame:
    """Costed runs: (label, accuracy %, energy µJ, area mm²)."""
    frame = pd.DataFrame(rows, columns=["label", "accuracy_pct", "device_energy_uj", "device_area_mm2"])
    return frame.assign(device_array_utilisation=0.31, metric="top1")


def test_the_label_of_a_digital_mapping_is_the_devices() -> None:
    digital = DeviceConfig(kind="cim", rows=128, adc_bits=5, depthwise="digital").label
    assert digital == "cim-r128-adc5" + DIGITAL_LABEL


def test_the_cheaper_mapping_is_named_in_energy_and_area() -> None:
    runs = chips(
        ("dscnn @cim-r128-adc5", 71.86, 0.461, 0.416),
        ("dscnn @cim-r128-adc5-dwdigital", 72.33, 0.474, 0.153),
        ("dscnn @cim-r64-adc4", 70.0, 0.3, 0.2),  # one mapping only: not compared
        ("n @cim", 80.0, 0.2, 0.5),
        ("n @cim-dwdigital", 70.0, 0.1, 0.6),
    )
    summary, table = depthwise_mapping(runs, drop_points=1.0)
    assert summary.endswith(
        "2 chip(s) run both ways: the digital unit costs less energy on 1, less area on 1; the two "
        "mappings' accuracies are within 1 point(s) on 1."
    )
    rows = table.splitlines()[2:]
    assert rows == [
        "| dscnn @cim-r128-adc5 | 71.86%, 0.461 µJ, 0.416 mm² | 31 | 72.33%, 0.474 µJ, 0.153 mm² "
        "| crossbar | digital | +0.47 |",
        "| n @cim | 80.00%, 0.2 µJ, 0.5 mm² | 31 | 70.00%, 0.1 µJ, 0.6 mm² | digital | crossbar | -10.00 |",
    ]
    assert depthwise_mapping(runs.iloc[[2]], drop_points=1.0) == []
    same = chips(("resnet8 @cim", 86.0, 1.07, 0.5), ("resnet8 @cim-dwdigital", 86.0, 1.07, 0.5))
    assert depthwise_mapping(same, drop_points=1.0) == []  # no grouped layer: one chip under two names


def test_each_network_gets_its_cheapest_chip_at_its_quality_target() -> None:
    runs = pd.DataFrame(
        {
            "label": ["vww @a", "vww @b", "vww @c", "ad @a", "dscnn @a"],
            "network": ["vww", "vww", "vww", "ad", "dscnn"],
            "accuracy_pct": [80.0, 85.0, 79.9, 84.0, 70.0],  # an AUC of 0.84 held as 84
            "device_energy_uj": [2.0, 3.0, 1.0, 0.01, 0.4],
            "device_area_mm2": [1.0, 1.0, 1.0, 1.0, 1.0],
            "device_latency_us": [1.0] * 5,
            "device_tops_per_w": [1.0] * 5,
            "quality_target": [0.80, 0.80, 0.80, 0.85, float("nan")],
            "metric": ["top1", "top1", "top1", "auc", "top1"],
        }
    )
    ad, vww = target_picks(runs)  # dscnn has no target: no line
    assert ad == "**No chip of ad reaches MLPerf Tiny's quality target (AUC 0.85).**"
    assert vww.startswith(
        "**Cheapest chip by energy for vww at MLPerf Tiny's quality target (80% top-1)**: vww @a — 80.00% on"
    )
