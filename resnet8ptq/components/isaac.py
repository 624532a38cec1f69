"""A published design rebuilt from the components a chip here is costed with: ISAAC's in-situ
multiply-accumulate unit (IMA; Shafiee et al., "ISAAC: A Convolutional Neural Network Accelerator with In-Situ
Analog Arithmetic in Crossbars", ISCA 2016, doi 10.1109/ISCA.2016.12), on its own settings, beside the power
and area the paper publishes for it (issue 61: a preset reproduces what it cites, or says by how much it does
not). ``python -m resnet8ptq.components.isaac [--adc-model murmann]`` prints the comparison.

ISAAC's IMA (the paper's table of ISAAC's parameters, 32 nm): eight 128 x 128 crossbars of 2-bit RRAM cells;
every row driven by a 1-bit DAC (16-bit inputs, one bit a read); each crossbar read every 100 ns, its 128
columns converted in turn by its own 8-bit ADC at 1.28 GS/s; shift-and-add units; input and output
registers. A 16-bit weight spans 8 cells of a row, so a crossbar holds 128 x 16 weights and the IMA computes
16,384 16-bit MACs in 16 reads (1.6 µs). ISAAC's figures are a fixed power per component, whatever the
data.

Rebuilt here, per 100 ns read at the paper's rates: 8 x 128 DAC conversions and row activations, 8 x 128 x 128
cell reads (at half the input and cell levels: the paper gives no data statistics), 8 x 128 ADC conversions,
bit-line readings and shift-adds, each priced by the part a chip here uses (:mod:`.costs`): ISAAC's ADC, DAC
and shift-add from hwcomponents-library (their figures come from this same table, so they check the
composition, not the models) or hwcomponents-adc's survey fit for the ADC (an independent check), the
:class:`~resnet8ptq.components.models.ResistiveCell` with CiMLoop's ISAAC cell figures (``CELLS["isaac"]``),
and hwcomponents-library's ``Wire``. Not rebuilt: the sample-and-hold circuits and the input and output
registers (0.01 and 1.47 of the IMA's 24.1 mW).
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass

from resnet8ptq.components.cells import CELLS
from resnet8ptq.components.config import ADC_MODELS, DAC_MODELS, NEUROSIM, adc_attributes
from resnet8ptq.components.costs import CELL, wire
from resnet8ptq.components.models import part

TECH_NODE = 32e-9
ARRAYS, ROWS, COLUMNS = 8, 128, 128
READ_PERIOD = 100e-9  # s: one crossbar read (1-bit inputs on every row, every column converted)
ADC_BITS, ADC_RATE, SHIFT_ADDS = 8, 1.28e9, 4
MACS_PER_READ = ARRAYS * ROWS * COLUMNS // 8 // 16  # 16-bit weights over 8 cells, 16 reads a 16-bit input
INPUT_LEVEL = CELL_LEVEL = 0.5

PUBLISHED = {
    "adc": (16.0, 0.0096),
    "dac": (4.0, 0.00017),
    "cells": (2.4, 0.0002),  # "memristor array": the cells and their wires
    "shift_add": (0.2, 0.00024),
    "sample_hold": (0.01, 0.00004),
    "registers": (1.24 + 0.23, 0.0021 + 0.00077),  # 2 KB input and 256 B output register
}
"""Per IMA, ISAAC's table: component -> (mW, mm²); they add up to its IMA's 289 mW / 12 and 0.157 mm² / 12."""


@dataclass(frozen=True)
class Compared:
    """One component of the IMA: its power and area rebuilt here (None: not rebuilt) and published."""

    component: str
    model: str
    power_mw: float | None
    area_mm2: float | None
    published_mw: float
    published_mm2: float


def isaac_ima(adc_model: str = "isaac") -> list[Compared]:
    """ISAAC's IMA rebuilt with ``adc_model`` (a ``components.adc_model``) beside the paper's figures."""
    node, cell = TECH_NODE, CELLS["isaac"]
    adc = part(
        "adc", ADC_MODELS[adc_model], "convert",
        (("tech_node", node), *adc_attributes(adc_model, ADC_BITS, ADC_RATE).items()),
    )  # fmt: skip
    dac = part("dac", DAC_MODELS["isaac"], "convert", (("tech_node", node), ("resolution", 1), ("rows", 1)))
    levels = (("input_level", INPUT_LEVEL), ("cell_level", CELL_LEVEL))
    cells = part("cells", CELL, "read", (("tech_node", node), ("cell", "isaac")), levels)
    word_line = wire("word_lines", COLUMNS * cell.width * node, node, cell.read_voltage)
    bit_line = wire("bit_lines", ROWS * cell.height * node, node, cell.read_voltage)
    shift_add = part(
        "shift_add", "hwcomponents_library.library.isaac.IsaacShiftAdd", "shift_add",
        (("tech_node", node), ("width", 16)),
    )  # fmt: skip
    drives, conversions = ARRAYS * ROWS, ARRAYS * COLUMNS  # per read

    def milliwatts(energy_per_read: float, leak: float = 0.0) -> float:
        return (energy_per_read / READ_PERIOD + leak) * 1e3

    array_energy = ARRAYS * ROWS * COLUMNS * cells.energy + drives * word_line.energy
    rebuilt = {
        "adc": (adc, milliwatts(conversions * adc.energy, ARRAYS * adc.leak_power), ARRAYS * adc.area),
        "dac": (dac, milliwatts(drives * dac.energy), drives * dac.area),
        "cells": (
            cells,
            milliwatts(array_energy + conversions * bit_line.energy),
            ARRAYS * ROWS * COLUMNS * cells.area,
        ),
        "shift_add": (shift_add, milliwatts(conversions * shift_add.energy), SHIFT_ADDS * shift_add.area),
    }
    compared = []
    for component, (mw, mm2) in PUBLISHED.items():
        if component in rebuilt:
            priced, power, area = rebuilt[component]
            compared.append(Compared(component, priced.model.rsplit(".", 1)[1], power, area * 1e6, mw, mm2))
        else:
            compared.append(Compared(component, "not rebuilt", None, None, mw, mm2))
    return compared


def totals(compared: list[Compared]) -> dict[str, float]:
    """The rebuilt IMA's power, area and energy per 16-bit MAC beside the published ones (the published
    without the parts not rebuilt, and whole)."""
    rebuilt = [row for row in compared if row.power_mw is not None]
    power = sum(row.power_mw for row in rebuilt)
    published = sum(row.published_mw for row in rebuilt)
    whole = sum(row.published_mw for row in compared)
    per_mac = READ_PERIOD / MACS_PER_READ * 1e-3 * 1e12  # pJ per MAC for 1 mW
    return {
        "power_mw": power,
        "published_mw": published,
        "published_whole_mw": whole,
        "area_mm2": sum(row.area_mm2 for row in rebuilt),
        "published_mm2": sum(row.published_mm2 for row in rebuilt),
        "pj_per_mac": power * per_mac,
        "published_pj_per_mac": whole * per_mac,
    }


def _table(adc_model: str) -> str:
    compared = isaac_ima(adc_model)
    lines = [
        "| component | model | power (mW) | ISAAC (mW) | error | area (mm²) | ISAAC (mm²) | error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in compared:
        if row.power_mw is None:
            published = f"{row.published_mw:g} | - | - | {row.published_mm2:g}"
            lines.append(f"| {row.component} | {row.model} | - | {published} | - |")
            continue
        lines.append(
            f"| {row.component} | {row.model} | {row.power_mw:.3g} | {row.published_mw:g} | "
            f"{row.power_mw / row.published_mw - 1:+.0%} | {row.area_mm2:.3g} | {row.published_mm2:g} | "
            f"{row.area_mm2 / row.published_mm2 - 1:+.0%} |"
        )
    total = totals(compared)
    lines.append(
        f"| rebuilt parts | | {total['power_mw']:.3g} | {total['published_mw']:.3g} | "
        f"{total['power_mw'] / total['published_mw'] - 1:+.0%} | {total['area_mm2']:.3g} | "
        f"{total['published_mm2']:.3g} | {total['area_mm2'] / total['published_mm2'] - 1:+.0%} |"
    )
    lines.append(
        f"\nEnergy per 16-bit MAC: {total['pj_per_mac']:.2f} pJ rebuilt (without the registers and "
        f"sample-and-hold), {total['published_pj_per_mac']:.2f} pJ ISAAC's whole IMA."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="ISAAC's IMA rebuilt from this tool's component models.")
    parser.add_argument("--adc-model", choices=list(ADC_MODELS), default="isaac")
    adc_model = parser.parse_args().adc_model
    if adc_model == "neurosim" and importlib.util.find_spec("hwcomponents_neurosim") is None:
        parser.error(f"hwcomponents-neurosim is not installed; {NEUROSIM}")
    print(_table(adc_model))


if __name__ == "__main__":
    main()
