"""The memory cells a chip's arrays are costed with (``components.cell``): each one's read (conductance range,
read voltage and pulse) and footprint, every figure with its source, and where no source read here gives one,
the figure named as borrowed from another cell (``Cell.borrowed``, shown in ``device.cost_model``). A chip
preset (``device/chip=pcm|sonos|eflash``) selects its own cell; a user's is a YAML file of the same fields."""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class Cell:
    """A memory cell's read: its conductance range, read voltage and pulse, and its footprint in feature
    sizes F (the technology node). A cell that conducts a current at its read voltage (a flash or charge-trap
    transistor in subthreshold) is given as that voltage over the current."""

    technology: str  # rram, pcm, sonos, eflash, ...: what device.cost_model names
    on_resistance: float  # Ω at the top level
    off_resistance: float  # Ω at level 0
    read_voltage: float  # V on a driven row
    read_pulse: float  # s of one read (pulse-width inputs: the longest)
    height: float  # F
    width: float  # F
    source: str
    # figures no source read for this cell gives, taken from another cell (``source`` says which and why)
    borrowed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        positive = ("on_resistance", "off_resistance", "read_voltage", "read_pulse", "height", "width")
        bad = [
            name for name in positive if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0)
        ]
        unknown = sorted(set(self.borrowed) - set(positive))
        if bad or unknown or self.off_resistance < self.on_resistance:
            raise ValueError(
                f"cell {self.technology!r}: "
                + "; ".join(
                    [f"{name}={getattr(self, name)!r}: expected a number > 0" for name in bad]
                    + [f"borrowed names no figure: {', '.join(unknown)}"] * bool(unknown)
                    + ["off_resistance below on_resistance"] * (self.off_resistance < self.on_resistance)
                )
            )

    def described(self) -> str:
        """The cell as ``device.cost_model`` names it: its technology, and its borrowed figures."""
        borrowed = f"; borrowed: {', '.join(self.borrowed)}" if self.borrowed else ""
        return f"{self.technology}{borrowed}"


NEUROSIM_CELL = (
    "NeuroSim V1.3's default 1T1R cell (readVoltage 0.5 V, readPulseWidth 10 ns, 4 F x 12 F), as for rram"
)
CELLS = {
    "rram": Cell(
        technology="rram",
        on_resistance=6e3,
        off_resistance=6e3 * 150,
        read_voltage=0.5,
        read_pulse=10e-9,
        height=4,
        width=12,
        source="NeuroSim V1.3 defaults (DNN_NeuroSim_V1.3 Inference_pytorch/NeuroSIM/Param.cpp: 1T1R RRAM, "
        "resistanceOn 6 kΩ, resistanceOff 150 x 6 kΩ, readVoltage 0.5 V, readPulseWidth 10 ns, "
        "4 F x 12 F); figures only, none of NeuroSim's code",
    ),
    "isaac": Cell(
        technology="rram",
        on_resistance=1333.0,
        off_resistance=20e3,
        read_voltage=0.2,
        read_pulse=1e-9,
        height=4,
        width=4,
        source="CiMLoop's ISAAC cell (mit-emze/cimloop workspace/models/memory_cells/"
        "rram_isaac_isca_2016.cell.yaml: RRAM, 1333 Ω on, 20 kΩ off, 0.2 V read (from PRIME), "
        "1 ns read pulse, 16 F² square); figures only",
    ),
    "neurram": Cell(
        technology="rram",
        on_resistance=250e3,
        off_resistance=1e6,
        read_voltage=0.5,
        read_pulse=10e-9,
        height=math.sqrt(125.73964497),
        width=math.sqrt(125.73964497),
        source="CiMLoop's NeuRRAM cell (mit-emze/cimloop workspace/models/memory_cells/"
        "rram_wan_nature_2022.cell.yaml: RRAM, 250 kΩ on, 1 MΩ off, 0.5 V read, 125.7 F² square; the read "
        "pulse, 10 ns, its wan_nature_2022 macro's READ_PULSE_WIDTH), of Wan et al., Nature 608, 504 (2022); "
        "figures only",
    ),
    "pcm": Cell(
        technology="pcm",
        on_resistance=1 / 25e-6,
        off_resistance=1 / 0.25e-6,
        read_voltage=0.2,
        read_pulse=250e-9,
        height=4,
        width=12,
        source="aihwkit's PCM: g_max 25 µS (inference/converter/conductance.py, the preset's "
        "PCMLikeNoiseModel levels), read pulse t_read = 250 ns (inference/noise/pcm.py; HERMES' 8-bit "
        "PWM inputs take up to 255 x 1 ns, Le Gallo et al., Nat. Electron. 6, 680 (2023)); g_min 0.25 µS, "
        "CrossSim's IBM PCM (simulator/devices/custom/PCM_Joshi.py: on/off 100, 0.25 to 25 µS; Joshi et "
        "al., Nat. Commun. 11, 2473 (2020)). Borrowed: the read voltage, CiMLoop's for its resistive cells "
        "(0.2 V, 'From PRIME', workspace/models/memory_cells/rram_isaac_isca_2016.cell.yaml), and the "
        "area, " + NEUROSIM_CELL + "; no source read here gives them",
        borrowed=("read_voltage", "height", "width"),
    ),
    "sonos": Cell(
        technology="sonos",
        on_resistance=35e3,
        off_resistance=6e12,
        read_voltage=0.1,
        read_pulse=10e-9,
        height=4,
        width=12,
        source="CrossSim's SONOS-TCAS (simulator/configs/SONOS-TCAS.json: Rmin 35 kΩ, Rmax 6 TΩ; "
        "simulator/parameters/xbar_parameters.py: Vread 0.1 V, 'used for SONOS'), the 40 nm arrays of "
        "Xiao et al., IEEE TCAS-I 69(4), 2022. Borrowed: the read pulse and the area, which no source read "
        "here gives: " + NEUROSIM_CELL,
        borrowed=("read_pulse", "height", "width"),
    ),
    "eflash": Cell(
        technology="eflash",
        on_resistance=0.1 / 2.86e-6,
        off_resistance=0.1 / 2.86e-6 * 1000,
        read_voltage=0.1,
        read_pulse=10e-9,
        height=math.sqrt(0.33e-12) / 55e-9,
        width=math.sqrt(0.33e-12) / 55e-9,
        source="a redesigned 55 nm NOR flash cell, 0.33 µm² (Guo et al., CICC 2017, arXiv:1611.03379; taken "
        "square: 10.4 F x 10.4 F at 55 nm) tuned in subthreshold 'within an almost three-orders-of-magnitude "
        "dynamic range' (Merrikh Bayat et al., ISCAS 2015, arXiv:1410.4781): on/off 1000. Borrowed: the top "
        "current and read voltage, which no source read here gives, from the sonos cell (a charge-storing "
        "transistor read in subthreshold: 0.1 V, 2.86 µA at 35 kΩ), and the read pulse from " + NEUROSIM_CELL,
        borrowed=("on_resistance", "read_voltage", "read_pulse"),
    ),
}
"""The cells a chip's arrays can be made of (``components.cell``), each with its sources; a chip preset
(``device/chip=pcm|sonos|eflash``) selects its own. A user's cell: ``components.cell=FILE.yaml`` with the
fields of :class:`Cell`."""


def cell_figures(name: str) -> Cell:
    """``components.cell``'s figures: one of :data:`CELLS`, or a user's YAML file of :class:`Cell`'s fields
    (``technology``, ``on_resistance``, ..., ``source``; ``borrowed`` optional)."""
    if name in CELLS:
        return CELLS[name]
    path = Path(name)
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(
            f"components.cell={name!r}: expected one of {', '.join(CELLS)}, or a cell's YAML file (the "
            "fields of Cell in resnet8ptq/components/cells.py, each with its source)"
        )
    if not path.is_file():
        raise ValueError(f"components.cell={name}: no such file")
    from omegaconf import OmegaConf

    figures = OmegaConf.to_container(OmegaConf.load(path))
    names = {item.name for item in fields(Cell)}
    required = {item.name for item in fields(Cell) if item.default is MISSING}
    if not isinstance(figures, dict) or required - set(figures) or set(figures) - names:
        keys = set(figures) if isinstance(figures, dict) else set()
        missing, unknown = sorted(required - keys) or ["none"], sorted(keys - names) or ["none"]
        raise ValueError(
            f"components.cell={name}: expected the fields {', '.join(sorted(names))}; missing: "
            f"{', '.join(missing)}; unknown: {', '.join(unknown)}"
        )
    return Cell(**figures | {"borrowed": tuple(figures.get("borrowed", ()))})
