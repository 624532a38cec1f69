"""MLPerf Tiny's published energy per inference of its benchmarks' reference models on whole systems, which
the report sets beside the chips costed here (their memories, data movement and control are not costed: the
published systems' are). Each figure is the ``Median energy cost`` line of the closed-division
``energy/results.txt`` cited beside it; per benchmark: ST's NUCLEO-U385 (Cortex-M33, the newest round),
Syntiant's NDP9120 and GreenWaves' GAP9 (the lowest of the v1.0-v1.3 closed division for VWW, KWS and AD)."""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from resnet8ptq.report.analysis import fmt

ST = "mlcommons/tiny_results_v1.3 closed/STMicroelectronics/results/NUCLEO_U385RG_Q"
SYNTIANT = "mlcommons/tiny_results_v1.0 closed/syntiant/results/syntiant_9120_0v9_30mhz"
GAP9 = "mlcommons/tiny_results_v1.0 closed/greenwaves-technologies/results/gap9_650_240"


class Published(NamedTuple):
    """One system's published median energy per inference (µJ) and the file it is read from."""

    system: str
    energy_uj: float
    source: str


PUBLISHED: dict[str, tuple[Published, ...]] = {
    "resnet8": (
        Published("ST NUCLEO-U385 (Cortex-M33)", 965.58, f"{ST}/ic/energy/results.txt"),
        # under closed/, its system file says Open division; the same files again in v1.1-v1.3
        Published("Syntiant NDP9120", 101.83, f"{SYNTIANT}/ic/energy/results.txt"),
        Published("GreenWaves GAP9", 27.71, f"{GAP9}/image_classification/energy/results.txt"),
    ),
    "vww": (
        Published("ST NUCLEO-U385 (Cortex-M33)", 518.9761, f"{ST}/vww/energy/results.txt"),
        Published("Syntiant NDP9120", 71.711, f"{SYNTIANT}/vww/energy/results.txt"),
        Published("GreenWaves GAP9", 40.801, f"{GAP9}/visual_wake_words/energy/results.txt"),
    ),
    "kws": (
        Published("ST NUCLEO-U385 (Cortex-M33)", 245.3412, f"{ST}/kws/energy/results.txt"),
        Published("Syntiant NDP9120", 31.537, f"{SYNTIANT}/kws/energy/results.txt"),
        Published("GreenWaves GAP9", 18.561, f"{GAP9}/keyword_spotting/energy/results.txt"),
    ),
    "ad": (  # Syntiant published no anomaly detection result (v1.0-v1.3)
        Published("ST NUCLEO-U385 (Cortex-M33)", 31.8347, f"{ST}/ad/energy/results.txt"),
        Published("GreenWaves GAP9", 5.252, f"{GAP9}/anomaly_detection/energy/results.txt"),
    ),
}
"""Per network (the `model` group's name of MLPerf Tiny's reference models), the published systems. A network
MLPerf Tiny did not benchmark (``dscnn``, ``custom``) has none."""


def energy_references(runs: pd.DataFrame) -> tuple[tuple[str, float], ...]:
    """The published systems drawn on the accuracy-vs-energy trade-off (µJ): those of the runs' network when
    they are all of one that MLPerf Tiny benchmarks, else none (one figure holds one network's lines)."""
    networks = set(runs["network"]) if len(runs) else set()
    if len(networks) != 1:
        return ()
    (network,) = networks
    return tuple((f"{p.system}, MLPerf Tiny", p.energy_uj) for p in PUBLISHED.get(network, ()))


def published_line(network: str, energy_uj: float) -> str | None:
    """``energy_uj`` (a chip's energy per inference of ``network``) beside MLPerf Tiny's published systems for
    its benchmark, the lowest first; None for a network MLPerf Tiny did not benchmark."""
    systems = sorted(PUBLISHED.get(network, ()), key=lambda p: p.energy_uj)
    if not systems:
        return None
    listed = ", ".join(f"{p.system} {p.energy_uj:g} µJ" for p in systems)
    ratio = systems[0].energy_uj / energy_uj
    versus = f"{ratio:.3g}x below" if ratio >= 1 else f"{1 / ratio:.3g}x above"
    return (
        f"MLPerf Tiny's published energy per inference for {network} (whole systems, memories included): "
        f"{listed}; this chip's {fmt(energy_uj, '.3g', ' µJ')} is {versus} the lowest (its memories, data "
        "movement and control not costed)."
    )
