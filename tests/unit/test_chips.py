"""Chip presets (conf/device/chip/*.yaml, `device/chip=...`): each composes into a valid crossbar that
implies device=cim, every value stays overridable, each names its sources, and a run records the preset it
came from (tag ``device.chip``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

import resnet8ptq.config  # noqa: F401  (registers base_config)
from resnet8ptq.config import quant_spec
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.resolve import chip_tag

pytestmark = pytest.mark.device

CONF = Path(__file__).resolve().parents[2] / "conf"
CHIPS = sorted(path.stem for path in (CONF / "device" / "chip").glob("*.yaml"))


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def device_of(*overrides: str) -> DeviceConfig:
    cfg = composed(*overrides)
    quant_spec(cfg)  # every check a run makes before any work
    return OmegaConf.to_object(cfg.device)


def test_the_presets_are_the_documented_ones() -> None:
    assert CHIPS == ["eflash", "ideal", "pcm", "sonos"]


@pytest.mark.parametrize("chip", CHIPS)
def test_each_preset_is_a_valid_crossbar(chip: str) -> None:
    device = device_of(f"device/chip={chip}")
    assert device.kind == "cim"
    assert device_of(f"device/chip={chip}", "device.rows=64").rows == 64  # overridable


def test_the_presets_hold_their_sources_figures() -> None:
    pcm, sonos = device_of("device/chip=pcm"), device_of("device/chip=sonos")
    assert (pcm.rows, pcm.adc_bits, pcm.weight_noise_model, pcm.drift, pcm.drift_compensation) == (
        512, 8, "pcm", "pcm", True,
    )  # fmt: skip
    sonos_settings = (sonos.rows, sonos.bits_per_cell, sonos.weight_noise_model, sonos.charge_loss)
    assert sonos_settings == (1152, 7, "sonos", "sonos")
    assert pcm.noisy and sonos.noisy and not device_of("device/chip=ideal").noisy
    eflash = device_of("device/chip=eflash")
    assert (eflash.bits_per_cell, eflash.weight_noise, eflash.weight_noise_model) == (7, 0.01, "proportional")
    assert eflash.noisy and (eflash.drift, eflash.charge_loss, eflash.rows) == ("none", "none", None)
    aged = device_of("device/chip=pcm", "device.t_inference=86400")
    assert aged.t_inference == 86400 and aged.label == "cim-r512-adc8-c7x1-npcm1-pcm-t86400-gdc"


@pytest.mark.parametrize("chip", [c for c in CHIPS if c != "ideal"])
def test_each_preset_cites_its_sources_and_says_what_it_leaves_out(chip: str) -> None:
    text = (CONF / "device" / "chip" / f"{chip}.yaml").read_text()
    comments = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert re.search(r"(aihwkit|CrossSim|NeuroSim) `[^`]+`", comments), "a simulator's file"
    assert re.search(r"\b(19|20)\d\d\b", comments), "a publication with its year"
    assert "Left out" in comments


def test_each_preset_is_costed_with_its_own_cell_and_the_cell_stays_overridable() -> None:
    cells = {chip: composed(f"device/chip={chip}").components.cell for chip in CHIPS}
    assert cells == {"eflash": "eflash", "ideal": "rram", "pcm": "pcm", "sonos": "sonos"}
    assert composed("device/chip=sonos", "components.cell=rram").components.cell == "rram"
    pcm = composed("device/chip=pcm").components
    assert (pcm.columns_per_adc, pcm.adc_rate) == (1, 1.3e7)  # HERMES: an ADC a column, 300 ps/LSB
    assert composed("device/chip=pcm", "components=none").components.kind == "none"


def test_a_run_records_the_preset_it_came_from() -> None:
    cfg = composed("device/chip=sonos")
    HydraConfig.instance().set_config(cfg)
    try:
        assert chip_tag() == {"device.chip": "sonos"}
        HydraConfig.instance().set_config(composed("device=cim"))
        assert chip_tag() == {}
    finally:
        HydraConfig.instance().cfg = None
