"""MLPerf Tiny's published energies beside the chips (resnet8ptq/report/published_energy.py): each of its
four benchmarks' reference models has its systems, each cited by its closed-division results file; a chip is
set beside the lowest; one figure draws one network's systems only."""

from __future__ import annotations

import pandas as pd

from resnet8ptq.report.published_energy import PUBLISHED, energy_references, published_line


def test_every_benchmark_has_cited_systems() -> None:
    assert set(PUBLISHED) == {"resnet8", "vww", "kws", "ad"}
    for systems in PUBLISHED.values():
        for system in systems:
            assert system.energy_uj > 0
            assert system.source.startswith("mlcommons/tiny_results_v1.")
            assert " closed/" in system.source and system.source.endswith("/energy/results.txt")


def test_a_chip_is_set_beside_the_lowest_published_system() -> None:
    line = published_line("kws", 0.5)
    assert line is not None and "GreenWaves GAP9 18.561 µJ, Syntiant NDP9120 31.537 µJ" in line
    assert "this chip's 0.5 µJ is 37.1x below the lowest" in line
    assert "is 2x above the lowest" in published_line("ad", 10.504)
    assert published_line("dscnn", 0.5) is None  # not an MLPerf Tiny benchmark's model


def test_one_figure_draws_one_networks_systems() -> None:
    vww = pd.DataFrame({"network": ["vww", "vww"]})
    assert [name for name, _ in energy_references(vww)] == [
        "ST NUCLEO-U385 (Cortex-M33), MLPerf Tiny",
        "Syntiant NDP9120, MLPerf Tiny",
        "GreenWaves GAP9, MLPerf Tiny",
    ]
    assert energy_references(pd.DataFrame({"network": ["vww", "kws"]})) == ()
    assert energy_references(pd.DataFrame({"network": ["dscnn"]})) == ()
    assert energy_references(pd.DataFrame({"network": []})) == ()
