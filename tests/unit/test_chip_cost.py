"""A device run's chip costs (resnet8ptq/components/): every part priced is hwcomponents' own answer through
its model selection; the energy is each component's actions times its part's energy; the ADC and DAC counts,
the latency and the area of a small chip by hand; the integer device as digital MACs; bad settings and designs
no model covers refused by name before any work (or skipped with why)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hwcomponents", reason="the component models need Python >= 3.12")

import hwcomponents

from resnet8ptq.components.cells import CELLS
from resnet8ptq.components.config import COMPONENTS, ComponentsConfig, uncovered
from resnet8ptq.components.costs import chip_cost, layer_table
from resnet8ptq.components.models import _model_class
from resnet8ptq.config import quant_spec
from resnet8ptq.device.actions import LayerActions, count_actions
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.errors import ConfigError
from tests.unit.test_config import composed
from tests.unit.test_device import conv_layer

SIDE = 4


def actions(device: DeviceConfig, channels_in: int = 16, channels_out: int = 12) -> list[LayerActions]:
    """One 3x3 conv layer's actions on ``device``, with made-up input statistics (a run measures them)."""
    layer = conv_layer(np.random.default_rng(0), channels_in, channels_out)
    model = IntegerModel("test", "x", layer.input_quant, "half_to_even", [layer])
    crossbar = device.crossbar() if device.kind == "cim" else None
    columns = (crossbar.columns if crossbar else None) or math.inf
    counted = count_actions(model, {"y": (channels_out, SIDE, SIDE)}, crossbar, columns)
    return [_with_statistics(layer) for layer in counted] if crossbar else counted


def _with_statistics(layer: LayerActions) -> LayerActions:
    from dataclasses import replace

    return replace(layer, mean_input=0.3)


CHIP = DeviceConfig(kind="cim", rows=64, adc_bits=5, dac_bits=1, bits_per_cell=4, cells_per_weight=2)


@pytest.mark.parametrize(
    "device",
    [CHIP, DeviceConfig(kind="cim", rows=128, adc_bits=8), DeviceConfig(kind="integer")],
    ids=["bit-serial-sliced", "8-bit-dac", "integer"],
)
def test_each_part_is_hwcomponents_own_answer(device: DeviceConfig) -> None:
    """hwcomponents' selection (get_action_cost, get_area, get_leak_power), given the part's model alone,
    answers what the cost used, for the same attributes and action."""
    cost = chip_cost(actions(device), device, ComponentsConfig())
    assert cost.parts
    for part in cost.parts:
        cls = _model_class(part.model)
        attributes = dict(_parse(part.attributes.split("; ")[0]))
        arguments = dict(_parse(part.attributes.split("; ")[1])) if "; " in part.attributes else {}
        names = getattr(cls, "component_name", None) or cls.__name__
        name = names[0] if isinstance(names, list) else names
        own = hwcomponents.get_action_cost(name, attributes, part.action, arguments, models=[cls])
        assert own.energy == pytest.approx(part.energy, rel=1e-3), part
        assert own.latency == pytest.approx(part.latency, rel=1e-3), part
        assert hwcomponents.get_area(name, attributes, models=[cls]) == pytest.approx(part.area, rel=1e-3)
        leak = hwcomponents.get_leak_power(name, attributes, models=[cls])
        assert leak == pytest.approx(part.leak_power, rel=1e-3, abs=1e-30)


def _parse(text: str) -> list[tuple[str, object]]:
    """``name=value, ...`` as Part.attributes shows them (4 significant digits for the statistics)."""
    pairs = []
    for item in text.split(", "):
        name, value = item.split("=")
        try:
            pairs.append((name, int(value)))
        except ValueError:
            try:
                pairs.append((name, float(value)))
            except ValueError:
                pairs.append((name, value))
    return pairs


def test_the_energy_is_each_components_actions_times_its_part() -> None:
    (layer,) = actions(CHIP)
    cost = chip_cost([layer], CHIP, ComponentsConfig())
    parts = {part.component: part for part in cost.parts}
    expected = {
        "cells": layer.cell_reads * parts["cells"].energy,
        "word_lines": layer.row_activations * parts["word_lines"].energy,
        "bit_lines": 2 * layer.adc_conversions * parts["bit_lines"].energy,
        "dac": layer.dac_conversions * parts["dac"].energy,
        "adc": layer.adc_conversions * parts["adc"].energy,
        "shift_add": layer.shift_adds * parts["shift_add"].energy,
        "accumulator": layer.accumulator_adds * parts["accumulator"].energy,
        "requantizer": layer.requantizations * parts["requantizer"].energy,
        "mac": 0.0,
    }
    for name, energy in expected.items():
        assert cost.energy[name] == pytest.approx(energy), name
    assert set(cost.energy) == set(COMPONENTS)
    assert cost.total_energy == pytest.approx(sum(expected.values()) + cost.energy["leakage"])
    metrics = cost.metrics()
    assert metrics["device_energy_uj"] == pytest.approx(cost.total_energy * 1e6)
    assert metrics["device_tops_per_w"] == pytest.approx(2 * layer.macs / cost.total_energy / 1e12)
    (row,) = layer_table(cost)
    assert row["adc"] == pytest.approx(cost.energy["adc"] * 1e6) and row["layer"] == "conv"


def test_a_small_chips_adcs_dacs_latency_and_area_by_hand() -> None:
    """16 x 9 = 144 terms over 64-row tiles: 3 tiles (64, 64, 16); 12 outputs x 2 weight slices = 24
    readings a tile, 3 ADCs a tile at 8 column pairs an ADC (9 ADCs); a DAC on each of the 144 rows;
    bit-serial 8-bit inputs: 8 slices per position, each a read pulse then 8 conversions per ADC."""
    (layer,) = actions(CHIP)
    components = ComponentsConfig()
    cost = chip_cost([layer], CHIP, components)
    parts = {part.component: part for part in cost.parts}
    assert (layer.tiles, layer.input_slices, layer.weight_slices) == (3, 8, 2)
    adcs, dacs = 3 * 3, 144
    assert cost.area["adc"] == pytest.approx(adcs * parts["adc"].area)
    assert cost.area["dac"] == pytest.approx(dacs * parts["dac"].area)
    assert cost.area["cells"] == pytest.approx(layer.cells * 4 * 12 * (22e-9) ** 2)
    read = max(parts["cells"].latency, parts["dac"].latency) + 8 * parts["adc"].latency
    assert cost.latency == pytest.approx(SIDE * SIDE * 8 * read)
    assert parts["adc"].latency == pytest.approx(1 / components.adc_rate)  # hwcomponents-adc: 1 / throughput
    assert parts["dac"].model.endswith("IsaacDAC")  # dac_model=auto: ISAAC's 1-bit DAC for 1 bit a cycle
    units = (
        adcs * (parts["adc"].leak_power + parts["accumulator"].leak_power)
        + 16 * parts["accumulator"].leak_power
        + parts["requantizer"].leak_power
    )
    assert cost.energy["leakage"] == pytest.approx(units * cost.latency)


def test_power_gating_leaves_each_layers_periphery_leaking_over_its_own_layer_only() -> None:
    """Two layers of 3 and 2 tiles: ungated, every unit leaks over the whole inference; gated, a layer's
    ADCs, DACs, shift-adds and their accumulators leak over their own layer's latency (and gated_leakage of
    it the rest of the time), the shared adders and the requantizer over the whole."""
    layers = actions(CHIP) + actions(CHIP, channels_in=8)
    assert [layer.tiles for layer in layers] == [3, 2]
    always_on = gated = None
    for fraction in (0.0, 0.1):
        components = ComponentsConfig(power_gating=True, gated_leakage=fraction)
        cost, ungated = chip_cost(layers, CHIP, components), chip_cost(layers, CHIP, ComponentsConfig())
        parts = {part.component: part for part in cost.parts}
        always_on = 16 * parts["accumulator"].leak_power + parts["requantizer"].leak_power
        periphery = [
            adcs * (parts["adc"].leak_power + parts["shift_add"].leak_power + parts["accumulator"].leak_power)
            + dacs * parts["dac"].leak_power
            for adcs, dacs in ((9, 144), (6, 72))
        ]
        spans = [row["latency"] for row in cost.layers]
        total = sum(spans)
        gated = sum(p * (t + fraction * (total - t)) for p, t in zip(periphery, spans, strict=True))
        assert cost.energy["leakage"] == pytest.approx(gated + always_on * total)
        assert ungated.energy["leakage"] == pytest.approx((sum(periphery) + always_on) * total)
        assert cost.energy["leakage"] < ungated.energy["leakage"]
        assert sum(row["leakage"] for row in cost.layers) == pytest.approx(cost.energy["leakage"])
        assert {k: v for k, v in cost.energy.items() if k != "leakage"} == {
            k: v for k, v in ungated.energy.items() if k != "leakage"
        }
    assert always_on is not None and gated is not None


@pytest.mark.parametrize("cell", ["pcm", "sonos", "eflash"])
def test_each_presets_cell_is_its_own_kind_and_its_read_costs_by_its_figures(cell: str) -> None:
    """A chip preset's cell (components/cells.py) prices the reads by its own figures (V² G t per read at
    the layer's levels), not the RRAM cell's, and the cost names its technology and borrowed figures."""
    (layer,) = actions(CHIP)
    cost, rram = (
        chip_cost([layer], CHIP, ComponentsConfig(cell=cell)),
        chip_cost([layer], CHIP, ComponentsConfig()),
    )
    figures = CELLS[cell]
    conductance = 1 / figures.off_resistance + layer.mean_cell * (
        1 / figures.on_resistance - 1 / figures.off_resistance
    )
    read = figures.read_voltage**2 * conductance * figures.read_pulse * layer.mean_input
    assert cost.energy["cells"] == pytest.approx(layer.cell_reads * read)
    assert cost.energy["cells"] != pytest.approx(rram.energy["cells"])
    assert cost.area["cells"] == pytest.approx(layer.cells * figures.height * figures.width * (22e-9) ** 2)
    assert f"cell {cell} ({cell}; borrowed: " in cost.source and "cell rram (rram)" in rram.source
    assert set(figures.borrowed) < {"on_resistance", "read_voltage", "read_pulse", "height", "width"}


def test_a_users_cell_is_a_yaml_file_of_the_cells_fields_and_a_bad_one_is_refused_by_name(tmp_path) -> None:
    figures = {
        "technology": "feram", "on_resistance": 1e5, "off_resistance": 1e7, "read_voltage": 0.3,
        "read_pulse": 5e-9, "height": 6, "width": 6, "source": "a paper",
    }  # fmt: skip
    path = tmp_path / "feram.yaml"
    path.write_text("\n".join(f"{key}: {value}" for key, value in figures.items()))
    (layer,) = actions(CHIP)
    cost = chip_cost([layer], CHIP, ComponentsConfig(cell=str(path)))
    assert f"cell {path} (feram)" in cost.source
    assert cost.area["cells"] == pytest.approx(layer.cells * 36 * (22e-9) ** 2)
    path.write_text("technology: feram\non_resistance: -1\ncolour: blue\n")
    with pytest.raises(ValueError, match=r"missing: height, off_resistance, .*; unknown: colour"):
        ComponentsConfig(cell=str(path))
    path.write_text("\n".join(f"{key}: {value}" for key, value in (figures | {"read_pulse": 0}).items()))
    with pytest.raises(ValueError, match=r"cell 'feram': read_pulse=0: expected a number > 0"):
        ComponentsConfig(cell=str(path))


def test_more_adc_bits_cost_more_and_a_wider_dac_changes_model() -> None:
    devices = {bits: DeviceConfig(kind="cim", rows=64, adc_bits=bits) for bits in (4, 6, 8)}
    costs = {bits: chip_cost(actions(device), device, ComponentsConfig()) for bits, device in devices.items()}
    assert costs[4].energy["adc"] < costs[6].energy["adc"] < costs[8].energy["adc"]
    assert costs[4].area["adc"] < costs[8].area["adc"]
    dacs = {part.model for part in costs[8].parts if part.component == "dac"}
    assert dacs == {"hwcomponents_library.library.brahms.BrahmsDAC"}  # auto: Brahms' 8-bit DAC at 8 bits


def test_the_integer_device_is_digital_macs() -> None:
    device = DeviceConfig(kind="integer")
    (layer,) = actions(device)
    cost = chip_cost([layer], device, ComponentsConfig(mac_units=32))
    parts = {part.component: part for part in cost.parts}
    assert parts["mac"].model.endswith("AladdinIntMAC")
    assert cost.energy["mac"] == pytest.approx(layer.macs * parts["mac"].energy)
    assert cost.energy["adc"] == cost.energy["cells"] == 0.0 == cost.area["cells"]
    assert cost.latency == pytest.approx(math.ceil(layer.macs / 32) * parts["mac"].latency)


def test_a_depthwise_layer_is_costed_on_the_mapping_it_runs_on() -> None:
    """A 3x3 conv then a 16-channel depthwise layer on a 128-row, 5-bit chip: ``depthwise=crossbar`` packs
    the 16 kernels 14 to an array (2 arrays, each with the ADCs of its 14 column pairs, a DAC on each of
    the 144 rows in use, bit lines as long as 14 kernels' 126 rows); ``digital`` prices the depthwise layer
    as integer MACs (the MAC units then on the chip too) and leaves the conv's cost as it was."""
    from dataclasses import replace

    rng = np.random.default_rng(0)
    conv = conv_layer(rng, channels_in=16, channels_out=16)
    depthwise = replace(
        conv_layer(rng, channels_in=1, channels_out=16), name="dw", input="y", output="z", groups=16
    )
    model = IntegerModel("test", "x", conv.input_quant, "half_to_even", [conv, depthwise])
    shapes = {"y": (16, SIDE, SIDE), "z": (16, SIDE, SIDE)}
    components = ComponentsConfig(columns_per_adc=1)
    costs, counts = {}, {}
    for mapping in ("crossbar", "digital"):
        device = DeviceConfig(kind="cim", rows=128, adc_bits=5, depthwise=mapping)
        counts[mapping] = [
            _with_statistics(a) for a in count_actions(model, shapes, device.crossbar(), math.inf)
        ]
        costs[mapping] = chip_cost(counts[mapping], device, components)
    on_arrays, packed = counts["crossbar"][1], costs["crossbar"]
    parts = {part.component: part for part in packed.parts}
    assert "mac" not in parts and on_arrays.arrays == 2 and on_arrays.blocks_per_array == 14
    assert packed.area["adc"] == pytest.approx((2 * 16 + 2 * 14) * parts["adc"].area)
    assert packed.area["dac"] == pytest.approx((144 + 16 * 9) * parts["dac"].area)
    dw_cost = packed.layers[1]
    assert (
        dw_cost["adc"] == pytest.approx(on_arrays.adc_conversions * parts["adc"].energy)
        and dw_cost["mac"] == 0
    )
    digital = costs["digital"]
    parts = {part.component: part for part in digital.parts}
    assert counts["digital"][1].mapping == "digital"
    conv_cost, dw_cost = digital.layers
    assert dw_cost["mac"] == pytest.approx(16 * SIDE * SIDE * 9 * parts["mac"].energy) and dw_cost["adc"] == 0
    unchanged = {key: value for key, value in packed.layers[0].items() if key != "leakage"}
    assert {key: value for key, value in conv_cost.items() if key != "leakage"} == unchanged  # leaks longer
    assert digital.area["adc"] == pytest.approx(2 * 16 * parts["adc"].area)
    assert digital.area["digital"] > packed.area["digital"]  # the MAC units


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": "cacti"}, r"components='cacti': expected one of hwcomponents, none"),
        ({"tech_node_nm": 3}, r"components.tech_node_nm=3: expected 7..130 nm"),
        ({"tech_node_nm": math.nan}, r"components.tech_node_nm=nan"),
        ({"cell": "flash"}, r"components.cell='flash': expected one of rram, isaac, neurram, pcm, sonos"),
        ({"cell": "missing.yaml"}, r"components.cell=missing.yaml: no such file"),
        ({"adc_model": "flash"}, r"components.adc_model='flash': expected one of murmann, isaac, neurosim"),
        ({"adc_rate": 0}, r"components.adc_rate=0: expected samples per second"),
        ({"adc_rate": 1e11}, r"components.adc_rate=1e\+11"),
        ({"columns_per_adc": 0}, r"components.columns_per_adc=0"),
        ({"dac_model": "r2r"}, r"components.dac_model='r2r': expected one of auto, isaac, brahms"),
        ({"mac_units": 0}, r"components.mac_units=0"),
        ({"vector_lanes": 0}, r"components.vector_lanes=0"),
        ({"gated_leakage": 1.5}, r"components.gated_leakage=1.5: expected a fraction"),
    ],
)
def test_bad_settings_are_refused_by_name(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ComponentsConfig(**settings)


def test_designs_no_model_covers_say_why() -> None:
    components = ComponentsConfig()
    assert uncovered(components, DeviceConfig(kind="cim", adc_bits=4)) is None
    assert uncovered(components, DeviceConfig(kind="integer")) is None
    assert "device.adc_bits=null is an ideal readout" in uncovered(components, DeviceConfig(kind="cim"))
    three = DeviceConfig(kind="cim", adc_bits=3)
    assert "device.adc_bits=3 is outside hwcomponents-adc's range (4..20 bits" in uncovered(components, three)
    assert uncovered(ComponentsConfig(adc_model="isaac"), three) is None
    assert uncovered(ComponentsConfig(kind="none"), three) is None


def test_without_the_component_packages_a_run_says_how_to_install_them(monkeypatch) -> None:
    """Python 3.11 (hwcomponents needs 3.12) or an install without them: the reason names what is missing
    and the install command."""
    import importlib.util

    from resnet8ptq.components import config

    real = importlib.util.find_spec
    monkeypatch.setattr(
        config.importlib.util, "find_spec", lambda name: None if name == "hwcomponents_adc" else real(name)
    )
    reason = uncovered(ComponentsConfig(), DeviceConfig(kind="integer"))
    assert reason.startswith("the component models are not installed: hwcomponents_adc")
    assert "pip install hwcomponents==1.0.114 hwcomponents-adc==1.0.21" in reason


def test_neurosims_adc_is_an_opt_in_that_says_its_licence_and_how_to_install_it(monkeypatch) -> None:
    """components.adc_model=neurosim without hwcomponents-neurosim, or with its binary failing (glibc 2.38):
    the reason names the licence and `make neurosim`; outside 1..16 bits, NeuroSim's range."""
    import importlib.util

    from resnet8ptq.components import config
    from resnet8ptq.components import neurosim as module

    neurosim, four = ComponentsConfig(adc_model="neurosim"), DeviceConfig(kind="cim", adc_bits=4)
    assert "outside NeuroSim's ADC range (1..16 bits)" in uncovered(
        neurosim, DeviceConfig(kind="cim", adc_bits=17)
    )
    real = importlib.util.find_spec
    with monkeypatch.context() as patched:
        patched.setattr(
            config.importlib.util,
            "find_spec",
            lambda name: None if name == "hwcomponents_neurosim" else real(name),
        )
        reason = uncovered(neurosim, four)
    assert reason.startswith(
        "hwcomponents-neurosim is not installed; components.adc_model=neurosim is an opt-in"
    )
    assert "CC BY-NC 4.0 (non-commercial use only); `make neurosim` installs it" in reason

    def failing() -> type:
        class Failing:
            def __init__(self, **_: object) -> None:
                raise ValueError("NeuroSIM returned error code 1")

        return Failing

    monkeypatch.setattr(
        config.importlib.util,
        "find_spec",
        lambda name: object() if name == "hwcomponents_neurosim" else real(name),
    )
    monkeypatch.setattr(module, "neurosim_adc_class", failing)
    reason = uncovered(neurosim, four)
    assert reason.startswith("hwcomponents-neurosim does not answer (NeuroSIM returned error code 1)")


def test_neurosims_adc_is_its_own_answer_where_it_is_installed() -> None:
    """Where `make neurosim` installed it (never in CI: CC BY-NC): a conversion is hwcomponents-neurosim's
    ADC's, one ADC's area and leakage its array's over its ADCs, and a 2-bit chip (below hwcomponents-adc's
    range) is costed."""
    neurosim = pytest.importorskip("hwcomponents_neurosim")
    from resnet8ptq.components.neurosim import NEUROSIM_ARRAY, neurosim_adc_class

    try:
        ours = neurosim_adc_class()(tech_node=22e-9, resolution=5, rate=1e8)
    except Exception as err:  # installed without its binary built
        pytest.skip(f"hwcomponents-neurosim does not answer: {err}")
    cell = f"{neurosim.__path__[0]}/cells/placeholder.cell"
    theirs = neurosim.ADC(
        tech_node=22e-9, cycle_period=1e-8, cell_config=cell, average_input_value=0.5, average_cell_value=0.5,
        read_pulse_width=1e-8, adc_resolution=5, **NEUROSIM_ARRAY,
    )  # fmt: skip
    adcs = NEUROSIM_ARRAY["cols_active_at_once"]
    assert ours.convert().energy == pytest.approx(theirs.read().energy, rel=1e-9)
    assert ours.area == pytest.approx(theirs.area / adcs) and ours.leak_power == pytest.approx(
        theirs.leak_power / adcs
    )
    two = DeviceConfig(kind="cim", rows=64, adc_bits=2, dac_bits=1)
    components = ComponentsConfig(adc_model="neurosim")
    assert uncovered(components, two) is None
    cost = chip_cost(actions(two), two, components)
    assert cost.energy["adc"] > 0 and "hwcomponents-neurosim 1.0.43" in cost.source


def test_a_required_cost_is_refused_before_any_work_and_an_optional_one_is_not() -> None:
    with pytest.raises(ConfigError, match=r"components.required=true: device.adc_bits=3 is outside"):
        quant_spec(composed("device=cim", "device.adc_bits=3", "components.required=true"))
    quant_spec(composed("device=cim", "device.adc_bits=3"))  # goes on; the run is tagged device.cost_skipped
    with pytest.raises(ConfigError, match=r"components.tech_node_nm=500"):
        quant_spec(composed("device=integer", "components.tech_node_nm=500"))


def test_the_library_loads_without_neurosim() -> None:
    """hwcomponents-library's package does not import without hwcomponents_neurosim; its permissive modules
    do (resnet8ptq/components/models.py)."""
    assert _model_class("hwcomponents_library.library.isaac.IsaacADC").__name__ == "IsaacADC"
    assert _model_class("hwcomponents_library.library.misc.Wire").__name__ == "Wire"


def test_the_chip_search_is_nsga2_over_the_chips_grid() -> None:
    """`+experiment=chip_search`: Optuna's NSGA-II over rows and ADC bits of a crossbar, accuracy on the
    device up and energy per inference down, each design costed or refused before any work."""
    from omegaconf import OmegaConf

    from resnet8ptq.search.objectives import directions, objective_values

    cfg = composed("+experiment=chip_search")
    sweeper = cfg.hydra.sweeper
    assert sweeper.sampler._target_ == "optuna.samplers.NSGAIISampler" and sweeper.sampler.seed == 42
    assert list(cfg.search.objectives) == ["accuracy_device", "device_energy_uj"]
    assert OmegaConf.to_container(sweeper, resolve=True)["direction"] == ["maximize", "minimize"]
    assert dict(sweeper.params) == {"device.rows": "choice(64,128,256)", "device.adc_bits": "choice(4,5,6,8)"}
    assert (cfg.device.kind, cfg.components.required, cfg.per_channel) == ("cim", True, True)
    quant_spec(cfg)
    assert directions(["device_area_mm2", "device_latency_us"]) == ["minimize", "minimize"]
    logged = {"accuracy_device": 0.86, "device_energy_uj": 1.07}
    assert objective_values(logged, ["accuracy_device", "device_energy_uj"], "run") == [0.86, 1.07]


def test_the_stage_tags_an_uncovered_design_and_writes_a_costed_ones_tables(tmp_path) -> None:
    from resnet8ptq.stages.costs import chip_costs

    skipped = chip_costs("ideal", [], DeviceConfig(kind="cim"), ComponentsConfig(), tmp_path / "a")
    assert skipped.metrics == {} and skipped.files == ()
    assert skipped.tags["device.cost_skipped"].startswith("device.adc_bits=null is an ideal readout")
    costed = chip_costs("chip", actions(CHIP), CHIP, ComponentsConfig(), tmp_path / "b")
    assert costed.tags["device.cost_model"].startswith("hwcomponents 1.0.114") and costed.metrics
    assert [(folder, path.name) for folder, path in costed.files] == [
        ("device", "costs.csv"),
        ("device", "components.csv"),
    ]
    assert all(path.parent == tmp_path / "b" / "device" for _, path in costed.files)


def test_isaacs_ima_rebuilt_on_its_own_settings() -> None:
    """ISAAC's IMA (resnet8ptq/components/isaac.py): the published components add up to the paper's IMA
    (289 mW and 0.157 mm² for 12); ISAAC's own ADC, DAC and shift-add, priced at ISAAC's rates, give its
    table's power within 10 % (hwcomponents-library prices them per action at 1.2 GHz, ISAAC runs its ADCs at
    1.28 GS/s) and its areas; the cells' power is the cell's figures by hand; hwcomponents-adc's ADC is an
    independent fit."""
    from resnet8ptq.components import isaac

    published = list(isaac.PUBLISHED.values())
    assert sum(mw for mw, _ in published) == pytest.approx(289 / 12, rel=1e-3)
    assert sum(mm2 for _, mm2 in published) == pytest.approx(0.157 / 12, rel=5e-3)
    rows = {row.component: row for row in isaac.isaac_ima("isaac")}
    for component in ("adc", "dac", "shift_add"):
        assert rows[component].power_mw == pytest.approx(rows[component].published_mw, rel=0.10), component
        assert rows[component].area_mm2 == pytest.approx(rows[component].published_mm2, rel=0.01), component
    g_off, g_on = 1 / 20e3, 1 / 1333
    read = 0.2**2 * (g_off + 0.5 * (g_on - g_off)) * 1e-9 * 0.5  # J per cell read at half levels
    assert rows["cells"].power_mw == pytest.approx(8 * 128 * 128 * read / 100e-9 * 1e3, rel=1e-3)
    assert rows["registers"].power_mw is None and rows["sample_hold"].power_mw is None
    total = isaac.totals(list(rows.values()))
    assert total["published_pj_per_mac"] == pytest.approx(289 / 12 * 1e-3 * 1.6e-6 / 16384 * 1e12, rel=1e-3)
    murmann = {row.component: row for row in isaac.isaac_ima("murmann")}
    assert murmann["adc"].model == "ADC" and murmann["adc"].power_mw != pytest.approx(rows["adc"].power_mw)


def test_neurram_core_rebuilt_across_its_reference_points(tmp_path: Path) -> None:
    """NeuRRAM's core (resnet8ptq/components/neurram.py), CiMLoop's validated Macro C: its latency and
    word-line and cell energies follow CiMLoop's description by hand; the errors against the paper's 14
    Fig. 12 settings, 8 breakdowns and area parts are pinned (model arithmetic, the same on every CPU), with
    ISAAC's DAC driving the rows, as a chip here is priced, and without it."""
    from resnet8ptq.components import neurram
    from resnet8ptq.components.neurram import Setting

    assert Setting(3, 1, True).latency == pytest.approx(0.27e-6 + 3 * 0.3e-6 + 0.3e-6)
    two_phase = Setting(10, 8, False)  # 7 magnitude bits: slices of 4 and 3, 15 + 7 pulses, 10 + 6 ADC steps
    assert (two_phase.phases, two_phase.integration_steps, two_phase.adc_steps) == ((4, 3), 22, 16)
    assert Setting(10, 8, True).phases == (7,) and Setting(4, 2, False).phases == (1,)
    energy = neurram.core_energy(Setting(8, 6, False), "none")
    word_line = ((1.5 + 0.6) * 256 + 48) * 1e-15 * 1.8**2
    assert energy["word_lines"] == pytest.approx(256 * 5 * word_line)
    cells = 256 * 256 * 0.5**2 * (1 / 1e6 + 0.5 * (1 / 250e3 - 1 / 1e6)) * 10e-9 * 0.5
    assert energy["input_pulses"] == pytest.approx(5 * cells, rel=0.05)  # + the rows' wires
    assert energy["input_pulses"] > 5 * cells
    with_dac = neurram.core_energy(Setting(8, 6, False))
    assert with_dac["input_pulses"] > 3 * energy["input_pulses"]  # ISAAC's DAC at 130 nm: 1.9 pJ a row
    assert with_dac["word_lines"] == energy["word_lines"] and with_dac["neurons"] == energy["neurons"]

    pinned = {
        "isaac": {"tops": (0.039, 0.090), "tops_per_w": (0.204, 0.296), "energy_breakdown": (0.661, 2.126)},
        "none": {"tops": (0.039, 0.090), "tops_per_w": (0.097, 0.175), "energy_breakdown": (0.091, 0.192)},
    }
    for row_driver, figures in pinned.items():
        summary = neurram.summary(row_driver)
        assert len(neurram.errors(row_driver)["tops_per_w"]) == 14
        assert len(neurram.errors(row_driver)["energy_breakdown"]) == 8 * 3
        for figure, (mean, worst) in figures.items():
            assert summary[figure] == pytest.approx((mean, worst), abs=1e-3), (row_driver, figure)
        assert summary["area"][1] < 0.01  # neurons and cells; the drivers' area is not rebuilt
    drawn = neurram.plot(tmp_path / "neurram.png")
    assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_presets_cited_chip_is_costed_at_its_operating_point() -> None:
    """resnet8ptq/components/cited.py: each chip preset set to its cited chip's operating point prices one
    MVM of the chip's array as a run prices a dense layer (its action counts by hand); the rebuilt figures
    beside the published ones are pinned (model arithmetic, the same on every CPU)."""
    from resnet8ptq.components import cited

    assert set(cited.CITED) == {"pcm", "sonos", "eflash"}  # every preset but ideal cites a chip
    hermes = cited.CITED["pcm"]
    device, components = cited.preset_config(hermes.preset, hermes.overrides)
    assert (device.rows, device.dac_bits, components.cell, components.columns_per_adc) == (256, 8, "pcm", 1)
    assert components.tech_node_nm == 14
    (mvm,) = cited.one_mvm(device, hermes.rows, hermes.outputs, hermes.input_bits)
    assert mvm.macs == 256 * 256 and mvm.input_slices == 1 and mvm.weight_slices == 1
    assert mvm.cell_reads == 256 * 2 * 256 and mvm.adc_conversions == 256 and mvm.dac_conversions == 256
    cost = cited.rebuilt(hermes)
    assert cost.latency == pytest.approx(250e-9 + 1 / 1.3e7)  # the read pulse, then one conversion
    figures = cited.compared(hermes)
    macro = cost.total_energy - cost.energy["accumulator"] - cost.energy["requantizer"]
    assert figures["tops_per_w"][0] == pytest.approx(2 * 256 * 256 / macro / 1e12)
    pinned = {"pcm": (29.6, 1.58, 327), "sonos": (121, 5.16, 90), "eflash": (43.6, 6.08, 90)}
    for preset, (tops_per_w, tops_per_mm2, latency_ns) in pinned.items():
        figures = cited.compared(cited.CITED[preset])
        rebuilt = (figures["tops_per_w"][0], figures["tops_per_mm2"][0], figures["latency_ns"][0])
        assert rebuilt == pytest.approx((tops_per_w, tops_per_mm2, latency_ns), rel=5e-3), preset
        assert figures["tops_per_w"][1] == cited.CITED[preset].tops_per_w
    (four_bit,) = cited.one_mvm(device, 4, 2, input_bits=4)
    assert four_bit.input_slices == 1 and four_bit.macs == 8
