"""A run's stages (resnet8ptq/stages/): found in their modules in order, each enabled by the settings it
serves; a run record names the stages that ran when asked for one that did not. (A stage added as a module,
run for real, logged, reported and explored: tests/integration/test_pipeline.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from resnet8ptq.stages import BUILT_IN, RunRecord, added, registered


def plan(
    device: bool = False,
    mcu: bool = False,
    tflite: bool = False,
    layer_analysis: bool = True,
    costs: bool = True,
    published: bool = True,
):
    return SimpleNamespace(
        device=SimpleNamespace(enabled=device),
        components=SimpleNamespace(enabled=costs),
        mcu=SimpleNamespace(enabled=mcu),
        backend=SimpleNamespace(MCU=tflite),
        cfg=SimpleNamespace(
            layer_analysis=layer_analysis, model=SimpleNamespace(published_reference=published)
        ),
    )


def enabled(**settings: bool) -> list[str]:
    return [stage.name for stage in registered() if stage.enabled(plan(**settings))]


def test_the_package_runs_its_own_stages_in_order() -> None:
    assert tuple(stage.name for stage in registered()) == BUILT_IN and added() == ()


def test_each_stage_runs_where_its_settings_ask_for_it() -> None:
    every_run = ["fp32", "published", "quantize"]
    assert enabled() == [*every_run, "layers"]
    assert enabled(layer_analysis=False) == every_run
    assert enabled(device=True) == [*every_run, "layers", "device", "costs"]
    assert enabled(device=True, costs=False) == [*every_run, "layers", "device"]
    assert enabled(costs=True) == [*every_run, "layers"]  # a chip's costs need a device run
    assert enabled(mcu=True) == [*every_run, "layers"]  # TFLite Micro runs TFLite models only
    assert enabled(mcu=True, tflite=True) == [*every_run, "layers", "mcu"]
    assert enabled(published=False) == ["fp32", "quantize", "layers"]  # published models are ResNet8's


def test_a_result_of_a_stage_that_did_not_run_names_those_that_did() -> None:
    record = RunRecord(plan(), "run", None, None, {"fp32": 1, "quantize": 2})
    assert record["quantize"] == 2
    with pytest.raises(KeyError, match="'device' has not run in this run \\(ran: fp32, quantize\\)"):
        record["device"]
