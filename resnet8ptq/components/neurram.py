"""A macro CiMLoop validated, rebuilt from the components a chip here is costed with: one core of NeuRRAM
(Wan et al., "A compute-in-memory chip based on resistive random-access memory", Nature 608, 504 (2022),
doi 10.1038/s41586-022-04992-8), CiMLoop's "Macro C" (Andrulis et al., ISPASS 2024; its validation
reports 6 % mean error in TOPS/W and 5 % in throughput over input-bit sweeps of its macros B and C, 4 % per
energy component, 8 % per area component). ``python -m resnet8ptq.components.neurram`` prints every point.

The core as CiMLoop describes it (mit-emze/cimloop ``workspace/models/arch/1_macro/wan_nature_2022``):
130 nm, 1.8 V; a 256 x 256 RRAM array holding 4-bit signed weights as two cells each (256 x 128 MACs, two
ops a MAC, per input vector) and 256 neurons. A signed input's magnitude bits (``input_bits - 1``) are
integrated as pulses: a slice of p bits takes ``2^p - 1`` integration steps, and inputs of more than 3
magnitude bits are split into two slices (two-phase) unless ``one_phase``; each neuron's variable-precision
ADC then takes one step per output bit (in the second phase, the bits the first phase left). Latency per
input vector: 0.27 µs an integration step, 0.3 µs an ADC step and 0.3 µs a phase; the chip has 48 cores.

Rebuilt here, per input vector, each priced by a model and counted as CiMLoop's description counts it:

* word-line switching: each of 256 word lines toggled once per magnitude bit, a capacitor of
  ``(1.5 + 0.6) fF x 256 + 48 fF`` (CiMLoop, from the paper) charged to 1.8 V (hwcomponents-library
  ``Capacitor``);
* input pulses: each magnitude bit a 10 ns read pulse on the 256 rows, each driven as a chip here drives
  its rows (a 1-bit DAC, ``row_driver``: ISAAC's by default, or none, and the row's ``Wire`` charged to the
  read voltage) and the 65,536 cells read (:class:`~resnet8ptq.components.models.ResistiveCell` with
  ``CELLS["neurram"]``) at mean input and cell levels of a half, as :mod:`.isaac` does;
* neurons: per neuron, an ADC step each (``NeurramVariablePrecisionADC``), an integration step each
  (``NeurramAnalogIntegrator``), a sample per magnitude bit (``NeurramAnalogSample``), a shift-add per phase
  (``NeurramShiftAdd`` at the output width; all four from hwcomponents-library's ``neurram`` module, whose
  figures come from the paper) and their leakage over the vector's latency.

Not rebuilt: the row, word-line and column drivers' area (CiMLoop takes them from NeuroSim, CC BY-NC, and
scales them 5.25x to the paper); weight programming. The reference figures are the paper's Fig. 12 (b-d)
and Fig. 11 (f) as CiMLoop's ``_tests.py`` digitised them; nothing here is fitted to them.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resnet8ptq.components.cells import CELLS
from resnet8ptq.components.config import DAC_MODELS
from resnet8ptq.components.costs import CELL, wire
from resnet8ptq.components.models import Part, part

TECH_NODE, VOLTAGE = 130e-9, 1.8
ROWS = COLUMNS = NEURONS = 256
CORES = 48  # TOPS are the whole chip's: 48 cores
OPS_PER_VECTOR = ROWS * COLUMNS // 2 * 2  # two cells a signed weight, two ops a MAC
MAX_ONE_PHASE_BITS = 3  # magnitude bits integrated in one phase before two-phase operation
INTEGRATE_STEP, ADC_STEP, PHASE = 0.27e-6, 0.3e-6, 0.3e-6  # s
WORD_LINE_CAPACITANCE = (1.5e-15 + 0.6e-15) * COLUMNS + 48e-15  # access transistors, RRAM coupling, driver
INPUT_LEVEL = CELL_LEVEL = 0.5
LIBRARY = "hwcomponents_library.library.neurram."
CATEGORIES = ("word_lines", "neurons", "input_pulses")
"""The paper's energy categories (Fig. 12b): WL switching; neuron operations and control; input pulses."""


@dataclass(frozen=True)
class Setting:
    """One operating point: output bits, signed input bits and one- or two-phase operation."""

    output_bits: int
    input_bits: int
    one_phase: bool

    @property
    def magnitude_bits(self) -> int:
        return max(1, self.input_bits - 1)

    @property
    def phases(self) -> tuple[int, ...]:
        bits = self.magnitude_bits
        if self.one_phase or bits <= MAX_ONE_PHASE_BITS:
            return (bits,)
        return (math.ceil(bits / 2), bits // 2)

    @property
    def integration_steps(self) -> int:
        return sum(2**bits - 1 for bits in self.phases)

    @property
    def adc_steps(self) -> int:
        return sum(max(self.output_bits - sum(self.phases[:i]), 0) for i in range(len(self.phases)))

    @property
    def latency(self) -> float:
        """Seconds per input vector."""
        return self.integration_steps * INTEGRATE_STEP + self.adc_steps * ADC_STEP + len(self.phases) * PHASE

    def __str__(self) -> str:
        return f"{self.output_bits}b out, {self.input_bits}b in, {'one' if self.one_phase else 'two'}-phase"


PUBLISHED_EFFICIENCY = {
    Setting(3, 1, True): (2.12230988, 43.07875866),
    Setting(4, 2, True): (1.793083771, 40.33412834),
    Setting(5, 3, True): (1.165400233, 23.09069279),
    Setting(6, 4, True): (0.7438677864, 15.95409517),
    Setting(7, 5, True): (0.4515642, 11.32999012),
    Setting(8, 6, True): (0.260797508, 9.12235241),
    Setting(3, 1, False): (2.12230988, 43.07875866),
    Setting(4, 2, False): (1.793083771, 40.33412834),
    Setting(5, 3, False): (1.165400233, 23.09069279),
    Setting(6, 4, False): (0.7438677864, 15.95409517),
    Setting(7, 5, False): (0.5254091287, 11.03166076),
    Setting(8, 6, False): (0.4177183338, 8.257196816),
    Setting(9, 7, False): (0.343873405, 7.750037817),
    Setting(10, 8, False): (0.2638743409, 6.437388185),
}
"""Setting -> (chip TOPS, TOPS/W): the paper's Fig. 12 (c, d), as CiMLoop's ``_tests.py`` gives them."""
PUBLISHED_BREAKDOWN = {
    Setting(3, 1, False): (8.99015248, 10.6186848, 3.446220545),
    Setting(4, 2, False): (8.270951256, 12.38674172, 3.955661604),
    Setting(5, 3, False): (15.46307324, 20.11826462, 7.73153662),
    Setting(6, 4, False): (21.75617998, 29.1084171, 11.50740478),
    Setting(7, 5, False): (30.92613276, 44.21188287, 14.0246365),
    Setting(8, 6, False): (37.2192395, 52.48282041, 19.23892768),
    Setting(9, 7, False): (43.69214654, 61.83258722, 22.83498524),
    Setting(10, 8, False): (50.52466791, 75.85721686, 27.50986693),
}
"""Setting -> fJ per op by :data:`CATEGORIES`: the paper's Fig. 12 (b), as CiMLoop's ``_tests.py`` has it."""
CORE_AREA = 1270e-12 * NEURONS / 0.28  # m²: 256 neurons of 1270 µm² are 28 % of the core (Fig. 11f)
PUBLISHED_AREA = {"neurons": 0.28 * CORE_AREA, "drivers": 0.21 * CORE_AREA, "cells": 0.12 * CORE_AREA}
AREA_SETTING = Setting(8, 8, False)  # CiMLoop's variables_iso.yaml: 8-bit inputs and outputs


def _neuron_parts(output_bits: int) -> dict[str, Part]:
    node = (("tech_node", TECH_NODE), ("voltage", VOLTAGE))
    return {
        "adc": part("adc", LIBRARY + "NeurramVariablePrecisionADC", "convert", node),
        "integrator": part("integrator", LIBRARY + "NeurramAnalogIntegrator", "integrate", node),
        "sample": part("sample", LIBRARY + "NeurramAnalogSample", "sample", (*node, ("width", output_bits))),
        "shift_add": part(
            "shift_add", LIBRARY + "NeurramShiftAdd", "shift_and_add", (*node, ("resolution", output_bits))
        ),
    }


def _row_drive(row_driver: str) -> float:
    """Joules to drive one row for one read pulse: ``row_driver``'s 1-bit conversion (a ``DAC_MODELS`` name,
    or ``none``) and the row's wire across the array charged to the read voltage."""
    cell = CELLS["neurram"]
    energy = wire("word_lines", COLUMNS * cell.width * TECH_NODE, TECH_NODE, cell.read_voltage).energy
    if row_driver != "none":
        resolution = (("tech_node", TECH_NODE), ("resolution", 1))
        energy += part("dac", DAC_MODELS[row_driver], "convert", resolution).energy
    return energy


def core_energy(setting: Setting, row_driver: str = "isaac") -> dict[str, float]:
    """Joules per input vector of one core, by :data:`CATEGORIES`, its rows driven by ``row_driver``."""
    bits = setting.magnitude_bits
    word_line = part(
        "word_lines", "hwcomponents_library.library.misc.Capacitor", "read",
        (("capacitance", WORD_LINE_CAPACITANCE), ("tech_node", TECH_NODE), ("voltage", VOLTAGE)),
    )  # fmt: skip
    levels = (("input_level", INPUT_LEVEL), ("cell_level", CELL_LEVEL))
    cell = part("cells", CELL, "read", (("tech_node", TECH_NODE), ("cell", "neurram")), levels)
    neuron = _neuron_parts(setting.output_bits)
    counts = {
        "adc": setting.adc_steps,
        "integrator": setting.integration_steps,
        "sample": bits,
        "shift_add": len(setting.phases),
    }
    per_neuron = sum(neuron[name].energy * count for name, count in counts.items())
    leak = sum(priced.leak_power for priced in neuron.values()) * setting.latency
    return {
        "word_lines": NEURONS * bits * word_line.energy,
        "neurons": NEURONS * (per_neuron + leak),
        "input_pulses": bits * (ROWS * _row_drive(row_driver) + ROWS * COLUMNS * cell.energy),
    }


def efficiency(setting: Setting, row_driver: str = "isaac") -> tuple[float, float]:
    """The chip's TOPS (48 cores) and TOPS/W at ``setting``."""
    tops = CORES * OPS_PER_VECTOR / setting.latency / 1e12
    return tops, OPS_PER_VECTOR / sum(core_energy(setting, row_driver).values()) / 1e12


def core_area() -> dict[str, float | None]:
    """m² of one core by the paper's area parts (None: not rebuilt), at :data:`AREA_SETTING`."""
    neuron = _neuron_parts(AREA_SETTING.output_bits)
    cell = CELLS["neurram"]
    return {
        "neurons": NEURONS * sum(priced.area for priced in neuron.values()),
        "drivers": None,
        "cells": ROWS * COLUMNS * cell.height * cell.width * TECH_NODE**2,
    }


def errors(row_driver: str = "isaac") -> dict[str, list[float]]:
    """Relative errors against the paper, per point: TOPS and TOPS/W at each of Fig. 12's 14 settings,
    each energy category at Fig. 12b's 8, each rebuilt area part."""
    rebuilt = {setting: efficiency(setting, row_driver) for setting in PUBLISHED_EFFICIENCY}
    breakdown = [
        core_energy(setting, row_driver)[category] / OPS_PER_VECTOR * 1e15 / published - 1
        for setting, figures in PUBLISHED_BREAKDOWN.items()
        for category, published in zip(CATEGORIES, figures, strict=True)
    ]
    area = core_area()
    return {
        "tops": [rebuilt[s][0] / published[0] - 1 for s, published in PUBLISHED_EFFICIENCY.items()],
        "tops_per_w": [rebuilt[s][1] / published[1] - 1 for s, published in PUBLISHED_EFFICIENCY.items()],
        "energy_breakdown": breakdown,
        "area": [area[name] / published - 1 for name, published in PUBLISHED_AREA.items() if area[name]],
    }


def summary(row_driver: str = "isaac") -> dict[str, tuple[float, float]]:
    """Mean and worst absolute relative error of each figure (:func:`errors`)."""
    return {
        figure: (statistics.fmean(map(abs, values)), max(map(abs, values)))
        for figure, values in errors(row_driver).items()
    }


def _tables(row_driver: str) -> str:
    lines = [
        "| setting | TOPS | paper | error | TOPS/W | paper | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for setting, (tops_paper, efficiency_paper) in PUBLISHED_EFFICIENCY.items():
        tops, tops_per_w = efficiency(setting, row_driver)
        lines.append(
            f"| {setting} | {tops:.3g} | {tops_paper:.3g} | {tops / tops_paper - 1:+.0%} | "
            f"{tops_per_w:.3g} | {efficiency_paper:.3g} | {tops_per_w / efficiency_paper - 1:+.0%} |"
        )
    header = " | ".join(f"{name} (fJ/op) | paper | error" for name in CATEGORIES)
    lines += ["", f"| setting | {header} |"]
    lines.append("| --- |" + " ---: | ---: | ---: |" * len(CATEGORIES))
    for setting, figures in PUBLISHED_BREAKDOWN.items():
        energy = core_energy(setting, row_driver)
        cells = []
        for category, published in zip(CATEGORIES, figures, strict=True):
            rebuilt = energy[category] / OPS_PER_VECTOR * 1e15
            cells.append(f"{rebuilt:.3g} | {published:.3g} | {rebuilt / published - 1:+.0%}")
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    lines += ["", "| area part | rebuilt (mm²) | paper (mm²) | error |", "| --- | ---: | ---: | ---: |"]
    for name, rebuilt in core_area().items():
        published = PUBLISHED_AREA[name] * 1e6
        shown = "not rebuilt | " if rebuilt is None else f"{rebuilt * 1e6:.3g} | "
        error = "-" if rebuilt is None else f"{rebuilt * 1e6 / published - 1:+.0%}"
        lines.append(f"| {name} | {shown}{published:.3g} | {error} |")
    lines.append("")
    for figure, (mean, worst) in summary(row_driver).items():
        lines.append(f"- {figure}: mean error {mean:.1%}, worst {worst:.1%}")
    return "\n".join(lines)


def plot(path: Path) -> Path:
    """The rebuilt core beside the paper: TOPS/W at Fig. 12's 14 settings (with and without the rows' DAC),
    and the energy per op by part at Fig. 12b's 8 (without it), as a PNG at ``path``."""
    from resnet8ptq.plots import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    settings = list(PUBLISHED_EFFICIENCY)
    x = np.arange(len(settings))
    left.plot(x, [PUBLISHED_EFFICIENCY[s][1] for s in settings], "ko", label="paper (Fig. 12d)")
    for row_driver, marker in (("isaac", "rx"), ("none", "b+")):
        shown = [efficiency(s, row_driver)[1] for s in settings]
        left.plot(x, shown, marker, markersize=9, label=f"rebuilt, row driver: {row_driver}")
    left.set_xticks(x, [f"{s.output_bits}/{s.input_bits}{'' if s.one_phase else '*'}" for s in settings])
    left.set(yscale="log", ylabel="TOPS/W", xlabel="output/input bits (* two-phase)", title="Efficiency")
    left.legend(fontsize=8)
    breakdown = list(PUBLISHED_BREAKDOWN)
    x = np.arange(len(breakdown))
    for offset, label in ((-0.2, "paper"), (0.2, "rebuilt")):
        bottom = np.zeros(len(breakdown))
        for index, category in enumerate(CATEGORIES):
            if label == "paper":
                values = np.array([PUBLISHED_BREAKDOWN[s][index] for s in breakdown])
            else:
                values = np.array(
                    [core_energy(s, "none")[category] / OPS_PER_VECTOR * 1e15 for s in breakdown]
                )
            hatch = "" if label == "paper" else "//"
            right.bar(x + offset, values, 0.38, bottom=bottom, color=f"C{index}", hatch=hatch,
                      label=f"{category} ({label})")  # fmt: skip
            bottom += values
    right.set_xticks(x, [f"{s.output_bits}/{s.input_bits}" for s in breakdown])
    right.set(ylabel="fJ per op", xlabel="output/input bits (two-phase)", title="Energy by part (Fig. 12b)")
    right.legend(fontsize=7, ncol=2)
    fig.suptitle("NeuRRAM's core rebuilt from this tool's parts beside the paper (Wan et al., Nature 2022)")
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.12, top=0.86, wspace=0.2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="NeuRRAM's core rebuilt from this tool's component models.")
    parser.add_argument(
        "--row-driver", choices=[*DAC_MODELS, "none"], default="isaac",
        help="the rows' 1-bit DAC, as a chip here is priced (none: the row's wire only)",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also draw the comparison to this file")
    arguments = parser.parse_args()
    print(_tables(arguments.row_driver))
    if arguments.plot:
        print(f"\nwrote {plot(arguments.plot)}")


if __name__ == "__main__":
    main()
