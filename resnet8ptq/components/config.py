"""The `components` config group (`conf/components/*.yaml`): what a device run's chip costs, in energy,
latency and area per inference, from the Accelergy project's ``hwcomponents`` component models
(:mod:`resnet8ptq.components.costs`; docs/chip_cost.md). ``hwcomponents`` (default: every device run is
costed where the models cover its design) or ``none``. Every default's source is beside it."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from resnet8ptq.components.cells import cell_figures
from resnet8ptq.device.config import DeviceConfig

KINDS = ("hwcomponents", "none")
ADC_MODELS = {
    "murmann": "hwcomponents_adc.ADC",
    "isaac": "hwcomponents_library.library.isaac.IsaacADC",
    "neurosim": "resnet8ptq.components.neurosim.NeuroSimADC",  # hwcomponents-neurosim's ADC, an opt-in
}
DAC_MODELS = {
    "isaac": "hwcomponents_library.library.isaac.IsaacDAC",
    "brahms": "hwcomponents_library.library.brahms.BrahmsDAC",
}
"""Each ``components.adc_model`` / ``dac_model`` choice and the ``hwcomponents`` model class it names
(``dac_model=auto`` picks one of the DACs)."""


def adc_attributes(adc_model: str, bits: int, rate: float) -> dict[str, object]:
    """What ``adc_model``'s class is built with for a ``bits``-bit ADC at ``rate`` samples per second (besides
    the technology node; ISAAC's ADC takes its rate from its own figures)."""
    return {
        "murmann": {"n_bits": bits, "throughput": rate, "n_adcs": 1},
        "neurosim": {"resolution": bits, "rate": rate},
    }.get(adc_model, {"resolution": bits})


DAC_AUTO_BITS = 4
"""``dac_model=auto``: ISAAC's 1-bit DAC up to this many bits per cycle, Brahms' 8-bit DAC above (each model
nearest the resolution it was measured at)."""
TECH_NODES_NM = (7.0, 130.0)
"""The technology nodes ``hwcomponents``' scaling tables hold (IRDS: 7 ... 130 nm); outside them it
extrapolates linearly, which these costs refuse."""
MURMANN_BITS = (4, 20)
"""The resolutions hwcomponents-adc's survey fit answers for (it asserts >= 4 bits; its table of the best
figure of merit per ENOB ends at 20)."""
MURMANN_MAX_RATE = 1e10
"""hwcomponents-adc's largest sample rate (its fit's ``frequency (Hz)`` maximum, e^23.03)."""
NEUROSIM_BITS = (1, 16)
"""The resolutions ``components.adc_model=neurosim`` is offered at (NeuroSim's sense amplifier: 1-16)."""
NEUROSIM = (
    "components.adc_model=neurosim is an opt-in: hwcomponents-neurosim 1.0.43 carries NeuroSim V1.3's code, "
    "licensed CC BY-NC 4.0 (non-commercial use only); `make neurosim` installs it into .venv and builds "
    "NeuroSim from its sources where its binary does not run (it needs glibc 2.38)"
)
PACKAGES = ("hwcomponents", "hwcomponents_adc", "hwcomponents_library")
"""The permissively licensed (MIT) component packages the costs need (Python >= 3.12)."""

COMPONENTS = (
    "cells", "word_lines", "bit_lines", "dac", "adc", "shift_add", "mac", "accumulator", "requantizer",
    "leakage",
)  # fmt: skip
"""Where an inference's energy goes (``device_energy_uj_<component>``, resnet8ptq/tracking/schema.py)."""
AREAS = ("cells", "adc", "dac", "digital")
"""Where the chip's area goes (``device_area_mm2_<part>``)."""
LABELS = {
    "tech_node_nm": "node", "cell": "cell-", "adc_model": "adc-", "adc_rate": "rate",
    "columns_per_adc": "cpa", "dac_model": "dac-", "mac_units": "macs", "vector_lanes": "lanes",
    "power_gating": "gated", "gated_leakage": "gl",
}  # fmt: skip
"""How a run's name shows each costing setting away from its default (not ``kind``, ``required``)."""
DIGITAL_LABELS = ("tech_node_nm", "mac_units", "vector_lanes")
"""The settings that cost the integer device (it has no cells, converters or arrays to gate)."""
INSTALL = "pip install hwcomponents==1.0.114 hwcomponents-adc==1.0.21 hwcomponents-library==1.0.58"


@dataclass
class ComponentsConfig:
    """How a device run's chip is costed. The defaults: a 22 nm chip of NeuroSim V1.3's default RRAM cells,
    one survey-fitted ADC per 8 columns at 100 MS/s, ISAAC's DACs, and a 128-MAC digital array as the
    integer device."""

    kind: str = "hwcomponents"  # hwcomponents | none (no costs)
    # a design no component model covers (an ideal ADC, hwcomponents-adc below 4 bits, Python < 3.12):
    # false: the run goes on without costs, its tag device.cost_skipped says why; true: an error before any
    # work
    required: bool = False
    tech_node_nm: float = 22.0  # every component's technology node (hwcomponents scales 7..130 nm)
    # the arrays' cells: CELLS (rram: NeuroSim V1.3's default 1T1R RRAM; isaac, neurram: CiMLoop's cells for
    # ISAAC and NeuRRAM; pcm, sonos, eflash: the chip presets' own, device/chip=...) or a cell's YAML file
    cell: str = "rram"
    # the ADC's model: murmann (hwcomponents-adc, Murmann's ADC survey fit, >= 4 bits) | isaac
    # (hwcomponents-library IsaacADC: ISAAC's 8-bit 32 nm SAR ADC, scaled by 2^bits) | neurosim (an opt-in,
    # CC BY-NC 4.0: hwcomponents-neurosim's ADC, NeuroSim V1.3's flash sense amplifier, 1..16 bits)
    adc_model: str = "murmann"
    adc_rate: float = 1e8  # samples per second of one ADC (100 MS/s; its latency per conversion: 1 / rate)
    columns_per_adc: int = 8  # differential column pairs one ADC converts in turn (NeuroSim: numColMuxed 8)
    # the row drivers: isaac (IsaacDAC: ISAAC's 1-bit DAC, 32 nm) | brahms (BrahmsDAC: BRAHMS' 8-bit DAC,
    # 40 nm), both scaled by 2^bits from their own resolution | auto: isaac up to 4 bits a cycle, brahms above
    dac_model: str = "auto"
    mac_units: int = 128  # device=integer: digital MACs in parallel (hwcomponents-library AladdinIntMAC)
    vector_lanes: int = 16  # adders working in parallel on the residual adds and pooling
    # each layer's array periphery (ADCs, DACs, shift-adds, their accumulators) switched off while other
    # layers run: false (ISAAC's and NeuroSim V1.3's accounting: every unit leaks over the whole inference) |
    # true: it leaks over its own layer's latency, and gated_leakage of its leakage power the rest of the time
    power_gating: bool = False
    gated_leakage: float = 0.0  # a gated unit's leakage, a fraction of its own (a sleep switch's: no figure)

    def __post_init__(self) -> None:
        low, high = TECH_NODES_NM
        checks = [
            (self.kind in KINDS, f"components={self.kind!r}: expected one of {', '.join(KINDS)}"),
            (
                math.isfinite(self.tech_node_nm) and low <= self.tech_node_nm <= high,
                f"components.tech_node_nm={self.tech_node_nm}: expected {low:g}..{high:g} nm, the "
                "technology nodes hwcomponents' scaling tables hold",
            ),
            (
                self.adc_model in ADC_MODELS,
                f"components.adc_model={self.adc_model!r}: expected one of {', '.join(ADC_MODELS)}",
            ),
            (
                math.isfinite(self.adc_rate) and 0 < self.adc_rate <= MURMANN_MAX_RATE,
                f"components.adc_rate={self.adc_rate:g}: expected samples per second in "
                f"(0, {MURMANN_MAX_RATE:g}] (hwcomponents-adc's largest rate)",
            ),
            (
                self.columns_per_adc >= 1,
                f"components.columns_per_adc={self.columns_per_adc}: expected >= 1 column pair per ADC",
            ),
            (
                self.dac_model in ("auto", *DAC_MODELS),
                f"components.dac_model={self.dac_model!r}: expected one of auto, {', '.join(DAC_MODELS)}",
            ),
            (self.mac_units >= 1, f"components.mac_units={self.mac_units}: expected >= 1 MAC"),
            (self.vector_lanes >= 1, f"components.vector_lanes={self.vector_lanes}: expected >= 1 lane"),
            (
                0 <= self.gated_leakage <= 1,
                f"components.gated_leakage={self.gated_leakage}: expected a fraction of its leakage, 0..1",
            ),
        ]
        failed = [message for ok, message in checks if not ok]
        try:
            cell_figures(self.cell)
        except (ValueError, TypeError) as err:
            failed.append(str(err).rstrip("."))
        if failed:
            raise ValueError("; ".join(failed) + ".")

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def label(self, device: str = "cim") -> str:
        """The settings that cost a ``device`` of that kind and differ from their defaults, as a run's name
        shows them after its device's (``cell-sonos-gated``; empty at the defaults: names stay as before)."""
        return costing_label({name: getattr(self, name) for name in LABELS}, device=device)

    def dac(self, dac_bits: int) -> str:
        """The DAC model for ``dac_bits`` per cycle (``auto``: the one measured nearest)."""
        if self.dac_model != "auto":
            return self.dac_model
        return "isaac" if dac_bits <= DAC_AUTO_BITS else "brahms"

    @property
    def tech_node(self) -> float:
        """The technology node in metres (hwcomponents' unit)."""
        return self.tech_node_nm * 1e-9


def uncovered(components: ComponentsConfig, device: DeviceConfig) -> str | None:
    """Why no component model costs ``device`` with these ``components`` settings (None: they do), checked
    before any work: the packages missing, an ideal ADC, an ADC resolution outside the chosen model's."""
    if not components.enabled or not device.enabled:
        return None
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        python = "" if sys.version_info >= (3, 12) else " (they need Python >= 3.12)"
        return f"the component models are not installed: {', '.join(missing)}{python}; {INSTALL}"
    if device.kind != "cim":
        return None
    if device.adc_bits is None:
        return (
            "device.adc_bits=null is an ideal readout, which no ADC model costs; set device.adc_bits "
            f"({MURMANN_BITS[0]}..{MURMANN_BITS[1]} with components.adc_model=murmann)"
        )
    if components.adc_model == "neurosim":
        return _neurosim_uncovered(components, device.adc_bits)
    low, high = MURMANN_BITS
    if components.adc_model == "murmann" and not low <= device.adc_bits <= high:
        return (
            f"device.adc_bits={device.adc_bits} is outside hwcomponents-adc's range ({low}..{high} bits: "
            "components.adc_model=murmann); components.adc_model=isaac scales ISAAC's ADC to any resolution, "
            "components.adc_model=neurosim (an opt-in) answers 1..16 bits"
        )
    return None


def _neurosim_uncovered(components: ComponentsConfig, adc_bits: int) -> str | None:
    """Why NeuroSim's ADC cannot cost ``adc_bits`` (None: it can): not installed, its binary not running,
    a resolution outside :data:`NEUROSIM_BITS`."""
    low, high = NEUROSIM_BITS
    if not low <= adc_bits <= high:
        return f"device.adc_bits={adc_bits} is outside NeuroSim's ADC range ({low}..{high} bits)"
    if importlib.util.find_spec("hwcomponents_neurosim") is None:
        return f"hwcomponents-neurosim is not installed; {NEUROSIM}"
    from resnet8ptq.components.neurosim import neurosim_adc_class

    try:
        neurosim_adc_class()(tech_node=components.tech_node, resolution=adc_bits, rate=components.adc_rate)
    except Exception as err:  # NeuroSim's binary fails as an Exception naming its log
        return f"hwcomponents-neurosim does not answer ({str(err).splitlines()[0][:200]}); {NEUROSIM}"
    return None


def costing_label(settings: Mapping[str, object], prefix: str = "", device: str = "cim") -> str:
    """:meth:`ComponentsConfig.label` of ``settings`` (``prefix + name -> value``; strings, as a run's params
    log them, read by each default's type; a missing one at its default) for a ``device`` of that kind."""
    parts = []
    defaults = {item.name: item.default for item in fields(ComponentsConfig)}
    for name, short in LABELS.items():
        if device != "cim" and name not in DIGITAL_LABELS:
            continue
        default, value = defaults[name], settings.get(prefix + name, defaults[name])
        if isinstance(value, str) and not isinstance(default, str):
            value = value.lower() == "true" if isinstance(default, bool) else type(default)(float(value))
        if value == default:
            continue
        if isinstance(value, bool):
            parts.append(short)
        elif name == "cell":
            parts.append(f"{short}{Path(str(value)).stem}")
        else:
            parts.append(f"{short}{value:g}" if isinstance(value, float) else f"{short}{value}")
    return "-".join(parts)
