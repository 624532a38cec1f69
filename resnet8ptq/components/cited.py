"""Each chip preset's cited chip, costed by this tool as the preset costs a network (issue 75): the preset's
own configuration (``device/chip=...``, its cell and converters) set to the cited chip's operating point,
one matrix-vector multiply (MVM) of the chip's array counted as a run counts a dense layer's actions
(:func:`~resnet8ptq.device.actions.count_actions`) and priced by
:func:`~resnet8ptq.components.costs.chip_cost`, beside the energy efficiency (TOPS/W) and density (TOPS/mm²)
the chip's paper publishes, with the energy and area component by component.
``python -m resnet8ptq.components.cited`` prints them.

The paper's figures are for its own data; the MVM here drives its rows at half their top level and its cells
at half their top level (the differential pair's other cell at zero), as :mod:`.isaac` and :mod:`.neurram` do.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from resnet8ptq.components.config import ComponentsConfig
from resnet8ptq.components.costs import ChipCost, chip_cost
from resnet8ptq.device.config import DeviceConfig

if TYPE_CHECKING:  # resnet8ptq.device.actions imports torch: imported where an MVM is counted
    from resnet8ptq.device.actions import LayerActions

CONF = Path(__file__).resolve().parents[2] / "conf"
INPUT_LEVEL = 0.5
CELL_LEVEL = 0.25  # a weight at half the top level on one cell of its pair, the other at zero


@dataclass(frozen=True)
class CitedChip:
    """A chip preset's cited chip at its published operating point: the overrides that set the preset to it,
    one MVM's size, and the paper's figures (None: not published)."""

    preset: str  # device/chip=...
    name: str
    overrides: tuple[str, ...]  # Hydra overrides on top of the preset: the operating point
    rows: int  # inputs of one MVM
    outputs: int  # its outputs (a differential pair of columns each)
    tops_per_w: float
    tops_per_mm2: float | None
    source: str
    digital: bool  # the published TOPS/W includes the digital side (accumulation, requantization)
    input_bits: int = 8  # unsigned inputs of the MVM
    latency_ns: float | None = None  # one MVM, where a source gives it


CITED = {
    "pcm": CitedChip(
        preset="pcm",
        name="IBM HERMES core",
        overrides=("device.rows=256", "components.tech_node_nm=14"),
        rows=256,
        outputs=256,
        tops_per_w=10.5,
        tops_per_mm2=1.59,
        digital=False,
        latency_ns=130.0,
        source="Khaddam-Aljameh et al., 'HERMES-Core: A 1.59-TOPS/mm2 PCM on 14-nm CMOS In-Memory Compute "
        "Core Using 300-ps/LSB Linearized CCO-Based ADCs', IEEE JSSC 57(4), 2022: a 256 x 256 core, 14 nm, "
        "'a measured energy efficiency of 10.5 TOPS/W' at 'a performance density of 1.59 TOPS/mm2' (the "
        "abstract); an MVM in 130 ns and, on the 64-core chip, 'the reported MVM energy includes the PCM "
        "crossbar array, ADCs, and PWMs' (Le Gallo et al., Nat. Electron. 6, 680 (2023), arXiv:2212.02872, "
        "Table I, as quoted by secondary sources: its full text was not reached)",
    ),
    "sonos": CitedChip(
        preset="sonos",
        name="Sandia/Infineon SONOS inference engine",
        overrides=("components.tech_node_nm=40",),
        rows=1152,
        outputs=128,
        tops_per_w=20.0,
        tops_per_mm2=None,
        digital=True,
        source="Xiao et al., 'An Accurate, Error-Tolerant, and Energy-Efficient Neural Network Inference "
        "Engine Based on SONOS Analog Memory', IEEE TCAS-I 69(4), 2022 (OSTI 1842837): 40 nm SONOS, "
        "'an inference architecture that achieves 20 TOPS/W on ResNet50' (the abstract; CrossSim's "
        "SONOS-TCAS: 1152 x 256 arrays, differential columns)",
    ),
    "eflash": CitedChip(
        preset="eflash",
        name="40 nm MLC NOR-flash CiM macro",
        overrides=("components.tech_node_nm=40", "device.dac_bits=4", "device.adc_bits=8"),
        rows=256,
        outputs=128,
        tops_per_w=35.6,
        tops_per_mm2=None,
        digital=False,
        input_bits=4,
        source="Zhang et al., 'A 40nm 1Mb 35.6 TOPS/W MLC NOR-Flash Based Computation-in-Memory Structure "
        "for Machine Learning', ISCAS 2021, doi 10.1109/ISCAS51556.2021.9401600: '35.6 TOPS/W with 4-bit "
        "multiplication and accumulation', an 8-bit SAR ADC (the abstract; its array size is not given)",
    ),
}
"""Each chip preset's cited chip (``ideal`` cites none)."""


def preset_config(preset: str, overrides: tuple[str, ...] = ()) -> tuple[DeviceConfig, ComponentsConfig]:
    """The device and components a run with ``device/chip=preset`` and ``overrides`` gets."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import resnet8ptq.config  # noqa: F401  (registers the structured configs the defaults list names)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"device/chip={preset}", *overrides])
    return OmegaConf.to_object(cfg.device), OmegaConf.to_object(cfg.components)


def one_mvm(device: DeviceConfig, rows: int, outputs: int, input_bits: int = 8) -> list[LayerActions]:
    """The actions of one MVM of ``rows`` unsigned ``input_bits``-bit inputs by ``outputs`` weights each,
    on ``device``'s crossbar, counted as a run counts a dense layer's, at :data:`INPUT_LEVEL` and
    :data:`CELL_LEVEL`."""
    from resnet8ptq.device.actions import count_actions
    from resnet8ptq.device.graph import Conv, IntegerModel, Quant

    quant = Quant(scale=1.0, zero_point=0, qmin=0, qmax=2**input_bits - 1)
    ones, zeros = np.ones(outputs), np.zeros(outputs)
    layer = Conv(
        name="mvm", input="x", output="y",
        weight=np.zeros((outputs, rows, 1, 1), np.int32), weight_zero_point=zeros.astype(np.int32),
        weight_scale=ones.astype(np.float32), bias=zeros.astype(np.int32), stride=(1, 1),
        padding=(0, 0, 0, 0), input_quant=quant, output_quant=quant, multiplier=ones.astype(np.int64),
        shift=zeros.astype(np.int64), act_min=-128, act_max=127, dense=True,
    )  # fmt: skip
    model = IntegerModel("cited", "x", quant, "half_to_even", [layer])
    crossbar = device.crossbar()
    columns = crossbar.columns or math.inf
    (counted,) = count_actions(model, {"x": (rows,), "y": (outputs,)}, crossbar, columns)
    return [dataclasses.replace(counted, mean_input=INPUT_LEVEL, mean_cell=CELL_LEVEL)]


def rebuilt(chip: CitedChip) -> ChipCost:
    """``chip``'s MVM costed with its preset at its operating point."""
    device, components = preset_config(chip.preset, chip.overrides)
    return chip_cost(one_mvm(device, chip.rows, chip.outputs, chip.input_bits), device, components)


DIGITAL = ("accumulator", "requantizer")
"""The digital side of an MVM: what a macro's published TOPS/W leaves out (``CitedChip.digital``)."""


def compared(chip: CitedChip, cost: ChipCost | None = None) -> dict[str, tuple[float, float | None]]:
    """The rebuilt figure (from ``cost``, else :func:`rebuilt`) beside the published one (None: not
    published): TOPS/W within the paper's boundary, TOPS/mm² and one MVM's latency in ns."""
    cost = cost or rebuilt(chip)
    ops = 2 * cost.macs
    energy = cost.total_energy - (0 if chip.digital else sum(cost.energy[name] for name in DIGITAL))
    return {
        "tops_per_w": (ops / energy / 1e12, chip.tops_per_w),
        "tops_per_mm2": (cost.metrics()["device_tops_per_mm2"], chip.tops_per_mm2),
        "latency_ns": (cost.latency * 1e9, chip.latency_ns),
    }


def _table(chip: CitedChip) -> str:
    cost = rebuilt(chip)
    boundary = "the whole MVM" if chip.digital else "without " + " and ".join(DIGITAL)
    lines = [f"**{chip.name}** (`device/chip={chip.preset} {' '.join(chip.overrides)}`): {chip.source}.", ""]
    lines += ["| figure | rebuilt | published | error |", "| --- | ---: | ---: | ---: |"]
    for name, (value, published) in compared(chip, cost).items():
        error = "-" if published is None else f"{value / published - 1:+.0%}"
        shown = "-" if published is None else f"{published:g}"
        label = f"{name} ({boundary})" if name == "tops_per_w" else name
        lines.append(f"| {label} | {value:.3g} | {shown} | {error} |")
    lines += ["", "| component | energy (pJ) | share |", "| --- | ---: | ---: |"]
    for name, joules in cost.energy.items():
        if joules:
            lines.append(f"| {name} | {joules * 1e12:.4g} | {joules / cost.total_energy:.0%} |")
    lines += ["", "| area part | mm² |", "| --- | ---: |"]
    lines += [f"| {name} | {m2 * 1e6:.4g} |" for name, m2 in cost.area.items() if m2]
    lines.append(f"\n{cost.source}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Each chip preset's cited chip, costed by this tool.")
    parser.add_argument("presets", nargs="*", metavar="PRESET", help=f"of {', '.join(CITED)} (default: all)")
    presets = parser.parse_args().presets or list(CITED)
    if unknown := sorted(set(presets) - set(CITED)):
        parser.error(f"no cited chip for {', '.join(unknown)}: expected {', '.join(CITED)}")
    for preset in presets:
        print(_table(CITED[preset]), end="\n\n")


if __name__ == "__main__":
    main()
