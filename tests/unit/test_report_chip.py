"""The chip section's depthwise-mapping comparison (resnet8ptq/report/chip.py): for each chip swept with its
depthwise layers on crossbars and on the digital unit, the cheaper mapping in energy and in area and their
accuracy gap; chips swept with one mapping only are not compared."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.report.chip import DIGITAL_LABEL, mapping_lines


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
    )
    (line,) = mapping_lines(runs, drop_points=1.0)
    assert line.startswith("**Depthwise layers of dscnn @cim-r128-adc5**: on crossbars 71.86%, 0.461 µJ")
    assert "(31.0 % of the arrays' cells used)" in line
    assert (
        "Less energy: crossbars; less area: the digital unit; the digital unit +0.47 points (within 1)."
        in line
    )
    swapped = chips(("n @cim", 80.0, 0.2, 0.5), ("n @cim-dwdigital", 70.0, 0.1, 0.6))
    (line,) = mapping_lines(swapped, drop_points=1.0)
    assert (
        "Less energy: the digital unit; less area: crossbars; the digital unit -10.00 points (beyond 1)."
        in line
    )
