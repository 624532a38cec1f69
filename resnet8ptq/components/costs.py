"""What one inference costs on the device a run simulated: energy by component and by layer, latency and area,
from its exact action counts (:mod:`resnet8ptq.device.actions`) and each component's model
(:mod:`resnet8ptq.components.models`), as Accelergy composes them: a component's energy is its action count
times its energy per action, plus its leakage power over the inference.

**The chip** (``device=cim``): each conv/dense layer has its own arrays (weights stay where they were
programmed), each array its own row drivers (one DAC a row) and ADCs (one per ``columns_per_adc``
differential column pairs). Per component and its actions:

* ``cells``: every cell read (:class:`~resnet8ptq.components.models.ResistiveCell` at the layer's mean input
  and cell levels);
* ``word_lines``: a row's wire across its array, charged to the read voltage at every row activation;
* ``bit_lines``: a column's wire down its tile, charged at every reading of it (the pair's two columns per
  ADC conversion);
* ``dac``: every DAC conversion; ``adc``: every ADC conversion;
* ``shift_add``: every shift-add (ISAAC's unit); ``accumulator``: the accumulator's, residual and pooling
  adds (Aladdin's adder at ``device.accumulator_bits``); ``requantizer``: one ``accumulator_bits`` x
  ``requantizer_bits`` fixed-point multiply per output element (Aladdin's multiplier; 32 x 32 by default, as
  TFLite/gemmlowp);
* ``leakage``: the leakage power the models give (the ADCs', the adders' and multipliers') over the
  inference's latency, for every unit on the chip; with ``components.power_gating``, a layer's array
  periphery (its ADCs, DACs, shift-adds and their accumulators) leaks over its own layer's latency only, and
  ``components.gated_leakage`` of its leakage power while the other layers run.

**Latency**: the layers run one after another; in a conv/dense layer every array works in parallel, and each
output position's input slices take one read pulse each, after which each ADC converts its column pairs in
turn (its model's latency per conversion); the digital side (shift-adds, accumulators, requantization)
works behind the next read, its latency hidden. Residual adds and pooling run on ``vector_lanes`` adders.

**Area**: cells (height x width feature sizes each), ADCs, DACs, and the digital units: a shift-add and an
accumulator per ADC, ``vector_lanes`` adders and one requantizer.

**The integer device** (``device=integer``), the digital baseline: ``mac_units`` integer MACs
(Aladdin's 8 x 8-bit multiplier and ``accumulator_bits`` adder) compute the MACs in parallel; the same
requantizer, residual and pooling adds.

Left out, on both: weight and activation memories (SRAM buffers: hwcomponents-library's and CACTI's SRAM
models run a CACTI binary that needs glibc 2.38), moving data between layers, control, and programming the
cells; the ADC's and DAC's static power beyond what their models call leakage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from resnet8ptq.components import config
from resnet8ptq.components.cells import cell_figures
from resnet8ptq.components.config import ADC_MODELS, AREAS, COMPONENTS, DAC_MODELS, ComponentsConfig
from resnet8ptq.components.models import Part, part, versions
from resnet8ptq.device.config import DeviceConfig

if TYPE_CHECKING:  # resnet8ptq.device.actions imports torch; the costs need only its records
    from resnet8ptq.device.actions import LayerActions

WIRE_CAPACITANCE = 2e-10
"""F per metre of a row's or a column's wire: hwcomponents-library ``Wire``'s default (0.2 fF/µm)."""
MULTIPLIER = "hwcomponents_library.library.aladdin.AladdinMultiplier"
ADDER = "hwcomponents_library.library.aladdin.AladdinAdder"
WIRE = "hwcomponents_library.library.misc.Wire"
CELL = "resnet8ptq.components.models.ResistiveCell"


def wire(component: str, length: float, tech_node: float, voltage: float) -> Part:
    """A row's or column's wire of ``length`` m, charged to ``voltage`` at every read (``WIRE``)."""
    attributes = (
        ("length", length), ("tech_node", tech_node),
        ("capacitance_per_m", WIRE_CAPACITANCE), ("voltage", voltage),
    )  # fmt: skip
    return part(component, WIRE, "read", attributes)


@dataclass
class ChipCost:
    """One inference's energy by component and by layer, its latency, the chip's area by part, and the
    component parts that priced them."""

    energy: dict[str, float]  # J by component (COMPONENTS)
    layers: list[dict[str, object]]  # per layer: J by component, its latency
    latency: float  # s
    area: dict[str, float]  # m² by part (AREAS)
    macs: int
    parts: list[Part] = field(default_factory=list)
    source: str = ""

    @property
    def total_energy(self) -> float:
        return sum(self.energy.values())

    @property
    def total_area(self) -> float:
        return sum(self.area.values())

    def metrics(self) -> dict[str, float]:
        """The run's cost metrics (their names and meanings: resnet8ptq/tracking/schema.py)."""
        ops = 2 * self.macs  # a MAC is two operations (TOPS' convention)
        return {
            "device_energy_uj": self.total_energy * 1e6,
            **{f"device_energy_uj_{name}": self.energy[name] * 1e6 for name in COMPONENTS},
            "device_latency_us": self.latency * 1e6,
            "device_area_mm2": self.total_area * 1e6,
            **{f"device_area_mm2_{name}": self.area[name] * 1e6 for name in AREAS},
            "device_tops_per_w": ops / self.total_energy / 1e12,
            "device_tops_per_mm2": ops / self.latency / 1e12 / (self.total_area * 1e6),
        }


def chip_cost(actions: list[LayerActions], device: DeviceConfig, components: ComponentsConfig) -> ChipCost:
    """One inference of a model with these ``actions`` on ``device``, costed with ``components`` (which must
    cover it: :func:`~resnet8ptq.components.config.uncovered`)."""
    pricing = _Pricing(device, components)
    layers = [pricing.layer(layer) for layer in actions]
    latency = sum(row["latency"] for row in layers)
    area, always_on, periphery = pricing.area(actions)
    gated = components.gated_leakage if components.power_gating else 1.0
    for row, leak_power in zip(layers, periphery, strict=True):
        share = row["latency"] + gated * (latency - row["latency"])  # s it leaks of the inference's
        row["leakage"] = leak_power * share + always_on * row["latency"]
    energy = {name: sum(row[name] for row in layers) for name in COMPONENTS}
    parts = sorted(set(pricing.used), key=lambda p: (p.component, p.attributes))
    cim = device.kind == "cim"
    source = f"{versions(cim and components.adc_model == 'neurosim')}; {components.tech_node_nm:g} nm"
    if cim:
        source += (
            f"; cell {components.cell} ({pricing.cell.described()}); "
            f"ADC {components.adc_model}; DAC {components.dac(device.dac_bits)}"
        )
    macs = sum(layer.macs for layer in actions)
    return ChipCost(energy, layers, latency, area, macs, parts, source)


class _Pricing:
    """The parts of one device and what each layer's actions cost with them."""

    def __init__(self, device: DeviceConfig, components: ComponentsConfig) -> None:
        self.device, self.components = device, components
        self.node = components.tech_node
        self.cell = cell_figures(components.cell)
        self.used: list[Part] = []
        accumulator = device.accumulator_bits
        self.adder = self._part("accumulator", ADDER, "add", tech_node=self.node, width=accumulator)
        self.requantizer = self._part(
            "requantizer", MULTIPLIER, "multiply",
            tech_node=self.node, width_a=accumulator, width_b=device.requantizer_bits,
        )  # fmt: skip
        if device.kind == "cim":
            bits = device.adc_bits
            self.adc = self._part(
                "adc", ADC_MODELS[components.adc_model], "convert",
                tech_node=self.node, **config.adc_attributes(components.adc_model, bits, components.adc_rate),
            )  # fmt: skip
            dac_model = components.dac(device.dac_bits)
            dac = {"isaac": {"rows": 1}}.get(dac_model, {})
            self.dac = self._part(
                "dac", DAC_MODELS[dac_model], "convert",
                tech_node=self.node, resolution=device.dac_bits, **dac,
            )  # fmt: skip
            self.shift_add = self._part(
                "shift_add", "hwcomponents_library.library.isaac.IsaacShiftAdd", "shift_add",
                tech_node=self.node, width=accumulator,
            )  # fmt: skip
        self._mac: Part | None = None

    @property
    def mac(self) -> Part:
        """The digital unit's integer MAC (the integer device's, a ``depthwise=digital`` layer's on a
        crossbar chip): priced at its first use."""
        if self._mac is None:
            self._mac = self._part(
                "mac", "hwcomponents_library.library.aladdin.AladdinIntMAC", "mac",
                tech_node=self.node, adder_width=self.device.accumulator_bits, multiplier_width=8,
            )  # fmt: skip
        return self._mac

    def _part(self, component: str, model: str, action: str, arguments: tuple = (), **attributes) -> Part:
        priced = part(component, model, action, tuple(attributes.items()), arguments)
        self.used.append(priced)
        return priced

    def layer(self, layer: LayerActions) -> dict[str, object]:
        """``layer``'s energy by component (J) and its latency (s)."""
        row: dict[str, object] = {"layer": layer.layer, "kind": layer.kind} | dict.fromkeys(COMPONENTS, 0.0)
        adds = layer.accumulator_adds + layer.residual_adds + layer.pooling_adds
        row["accumulator"] = adds * self.adder.energy
        row["requantizer"] = layer.requantizations * self.requantizer.energy
        lanes = self.components.vector_lanes
        row["latency"] = math.ceil((layer.residual_adds + layer.pooling_adds) / lanes) * self.adder.latency
        if layer.kind not in ("conv", "dense"):
            return row
        if not self._on_arrays(layer):
            row["mac"] = layer.macs * self.mac.energy
            row["latency"] = math.ceil(layer.macs / self.components.mac_units) * self.mac.latency
            return row
        geometry = _array(layer, self.device)
        if math.isnan(layer.mean_input):
            raise ValueError(
                f"{layer.layer}: no input statistics (device runs measure them on calibration images)"
            )
        cell = self._part(
            "cells", CELL, "read", (("input_level", layer.mean_input), ("cell_level", layer.mean_cell)),
            tech_node=self.node, cell=self.components.cell,
        )  # fmt: skip
        word_line = self._wire("word_lines", geometry.columns * self.cell.width * self.node)
        bit_line = self._wire("bit_lines", geometry.rows * self.cell.height * self.node)
        row["cells"] = layer.cell_reads * cell.energy
        row["word_lines"] = layer.row_activations * word_line.energy
        row["bit_lines"] = 2 * layer.adc_conversions * bit_line.energy
        row["dac"] = layer.dac_conversions * self.dac.energy
        row["adc"] = layer.adc_conversions * self.adc.energy
        row["shift_add"] = layer.shift_adds * self.shift_add.energy
        per_adc = math.ceil(geometry.readings / geometry.adcs(self.components.columns_per_adc))
        read = max(cell.latency, self.dac.latency) + per_adc * self.adc.latency
        row["latency"] = layer.positions * layer.input_slices * read
        return row

    def _wire(self, component: str, length: float) -> Part:
        priced = wire(component, length, self.node, self.cell.read_voltage)
        self.used.append(priced)
        return priced

    def _on_arrays(self, layer: LayerActions) -> bool:
        """A conv/dense layer computed on the crossbar's arrays (not on the integer device or, mapped
        ``digital``, on the digital unit's MACs)."""
        return self.device.kind == "cim" and layer.kind in ("conv", "dense") and layer.mapping == "crossbar"

    def area(self, actions: list[LayerActions]) -> tuple[dict[str, float], float, list[float]]:
        """The chip's area by part (m²), the leakage power (W) of its shared units (vector lanes,
        requantizer, MACs), and of each layer's array periphery (ADCs, DACs, shift-adds, their accumulators;
        0 for a layer without arrays)."""
        lanes = self.components.vector_lanes
        shared = [(self.adder, lanes), (self.requantizer, 1)]
        area = dict.fromkeys(AREAS, 0.0)
        convs = [layer for layer in actions if layer.kind in ("conv", "dense")]
        if self.device.kind != "cim" or any(layer.mapping == "digital" for layer in convs):
            shared.append((self.mac, self.components.mac_units))
        periphery = [0.0] * len(actions)
        units = list(shared)
        for index, layer in enumerate(actions):
            if not self._on_arrays(layer):
                continue
            adcs = layer.arrays * _array(layer, self.device).adcs(self.components.columns_per_adc)
            dacs = layer.terms * layer.groups * layer.column_groups  # every array's rows in use
            own = [(self.adc, adcs), (self.dac, dacs), (self.shift_add, adcs), (self.adder, adcs)]
            periphery[index] = sum(p.leak_power * n for p, n in own)
            units += own
            area["cells"] += layer.cells * self.cell.height * self.cell.width * self.node**2
        for component in ("adc", "dac"):
            area[component] = sum(p.area * n for p, n in units if p.component == component)
        area["digital"] = sum(p.area * n for p, n in units if p.component not in ("adc", "dac"))
        return area, sum(p.leak_power * n for p, n in shared), periphery


class _Array(NamedTuple):
    """One array of a conv/dense layer: its rows in use (the largest tile, times the group blocks side by side
    in it), its columns and the readings (column pairs of a weight slice) its ADCs convert per input
    slice."""

    rows: int
    columns: int
    readings: int

    def adcs(self, columns_per_adc: int) -> int:
        """The array's ADCs: one per ``columns_per_adc`` readings."""
        return math.ceil(self.readings / columns_per_adc)


def _array(layer: LayerActions, device: DeviceConfig) -> _Array:
    """``layer``'s arrays on ``device``: the pair's two columns per reading of a weight slice and output,
    spread over its column groups; a grouped layer's blocks side by side (``blocks_per_array``)."""
    blocks, per_group = layer.blocks_per_array, layer.outputs // layer.groups
    readings = math.ceil(layer.weight_slices * per_group / layer.column_groups) * blocks
    return _Array(min(device.rows or layer.terms, layer.terms) * blocks, 2 * readings, readings)


def layer_table(cost: ChipCost) -> list[dict[str, object]]:
    """One row per layer: its energy by component in µJ and its latency in µs (``device/costs.csv``)."""
    return [
        {key: (value * 1e6 if isinstance(value, float) else value) for key, value in row.items()}
        for row in cost.layers
    ]
