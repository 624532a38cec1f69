"""Stage ``costs`` (`device` != none, `components` != none): what one inference costs on the device the run
simulated, energy by component and layer, latency and area, from its action counts and the component models
of the `components` group (resnet8ptq/components/, docs/chip_cost.md)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from resnet8ptq.components.config import ComponentsConfig, uncovered
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.inputs import RunInputs
from resnet8ptq.resolve import Plan
from resnet8ptq.stages import RunRecord, Stage, StageResult

if TYPE_CHECKING:
    from resnet8ptq.components.costs import ChipCost

log = logging.getLogger(__name__)


class CostsStage(Stage):
    name = "costs"
    order = 45

    def enabled(self, plan: Plan) -> bool:
        return plan.device.enabled and plan.components.enabled

    def run(self, inputs: RunInputs, record: RunRecord) -> StageResult:
        plan = record.plan
        actions = record["device"].result.actions
        return chip_costs(plan.name, actions, plan.device, plan.components, record.output_dir)


STAGE = CostsStage()


def chip_costs(
    name: str, actions: list, device: DeviceConfig, components: ComponentsConfig, output_dir: Path
) -> StageResult:
    """What one inference with these ``actions`` costs on ``device`` (the run's metrics, its
    ``device.cost_model`` tag, ``device/costs.csv`` and ``device/components.csv`` written under
    ``output_dir``), or the ``device.cost_skipped`` tag saying why no component model covers it."""
    reason = uncovered(components, device)
    if reason is not None:
        log.warning("%s: not costed: %s", name, reason)
        return StageResult(tags={"device.cost_skipped": reason})
    from resnet8ptq.components.costs import chip_cost  # hwcomponents: only when a run is costed

    cost = chip_cost(actions, device, components)
    log.info(
        "%s: %.3f µJ, %.2f µs, %.3f mm² per inference on the chip (%s)",
        name, cost.total_energy * 1e6, cost.latency * 1e6, cost.total_area * 1e6, cost.source,
    )  # fmt: skip
    files = _files(cost, output_dir / "device")
    return StageResult(metrics=cost.metrics(), tags={"device.cost_model": cost.source}, files=files)


def _files(cost: ChipCost, out: Path) -> tuple:
    """``costs.csv`` (per layer) and ``components.csv`` (the parts), written to ``out``."""
    from resnet8ptq.components.costs import layer_table

    out.mkdir(parents=True, exist_ok=True)
    costs, parts = out / "costs.csv", out / "components.csv"
    pd.DataFrame(layer_table(cost)).to_csv(costs, index=False)
    pd.DataFrame([part.row() for part in cost.parts]).to_csv(parts, index=False)
    return (("device", costs), ("device", parts))
