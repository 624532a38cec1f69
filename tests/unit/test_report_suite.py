"""One chip for a suite of networks (resnet8ptq/report/suite.py): the design that keeps every network within
the drop at the least total energy, each network's own cheapest design beside it; a design that loses one
network is not a candidate; one network alone has no suite."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.report.suite import suite_section


def runs(*rows: tuple[str, str, float, float]) -> pd.DataFrame:
    """Costed runs: (network, device design, energy µJ, points vs the integer device)."""
    frame = pd.DataFrame(rows, columns=["network", "device", "device_energy_uj", "vs_integer"])
    return frame.assign(accuracy_pct=80.0)


def test_the_suites_chip_keeps_every_network_at_the_least_total_energy() -> None:
    sweep = runs(
        ("resnet8", "cim-r128-adc4", 0.9, -3.0),  # loses ResNet8: not a candidate
        ("dscnn", "cim-r128-adc4", 0.3, -0.2),
        ("resnet8", "cim-r128-adc5", 1.0, -0.5),
        ("dscnn", "cim-r128-adc5", 0.5, -0.1),
        ("resnet8", "cim-r256-adc5", 0.95, -0.6),
        ("dscnn", "cim-r256-adc5", 0.6, -0.1),  # total 1.55 against 1.5
    )
    line, table = suite_section(sweep, drop_points=1.0)
    assert line.startswith(
        "**One chip for the suite** (dscnn, resnet8): **cim-r128-adc5** keeps every network"
    )
    assert (
        "1.5 µJ for one inference of each (the most: resnet8, 1 µJ); of the sweep's 3 designs, 2 keep them "
        "all." in line
    )
    assert table.splitlines()[2:] == [
        "| dscnn | 0.5 | -0.10 | cim-r128-adc4 | 0.3 | 40.0 |",
        "| resnet8 | 1 | -0.50 | cim-r256-adc5 | 0.95 | 5.0 |",
    ]


def test_no_design_or_one_network() -> None:
    lost = runs(("a", "d1", 1.0, -5.0), ("b", "d1", 1.0, 0.0), ("a", "d2", 1.0, 0.0), ("b", "d2", 1.0, -5.0))
    (line,) = suite_section(lost, drop_points=1.0)
    assert line == (
        "**One chip for the suite** (a, b): no chip design of the sweep keeps every network within 1 "
        "point(s) of its integer device."
    )
    assert suite_section(runs(("a", "d1", 1.0, 0.0), ("a", "d2", 2.0, 0.0)), drop_points=1.0) == []
