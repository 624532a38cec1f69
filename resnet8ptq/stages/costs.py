"""Stage ``costs`` (`device` != none, `components` != none): what one inference costs on the device the run
simulated, energy by component and layer, latency and area, from its action counts and the component models
of the `components` group (resnet8ptq/components/, docs/chip_cost.md)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pandas as pd

from resnet8ptq.components.config import uncovered
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
        components = plan.components
        reason = uncovered(components, plan.device)
        if reason is not None:
            log.warning("%s: not costed: %s", plan.name, reason)
            return StageResult(tags={"device.cost_skipped": reason})
        from resnet8ptq.components.costs import chip_cost  # hwcomponents: only when a run is costed

        cost = chip_cost(record["device"].result.actions, plan.device, components)
        log.info(
            "%s: %.3f µJ, %.2f µs, %.3f mm² per inference on the chip (%s)",
            plan.name, cost.total_energy * 1e6, cost.latency * 1e6, cost.total_area * 1e6, cost.source,
        )  # fmt: skip
        return StageResult(
            metrics=cost.metrics(), tags={"device.cost_model": cost.source}, files=_files(cost, record)
        )


def _files(cost: ChipCost, record: RunRecord) -> tuple:
    """``device/costs.csv`` (per layer) and ``device/components.csv`` (the parts), written to the run's
    output directory."""
    from resnet8ptq.components.costs import layer_table

    out = record.output_dir / "device"
    out.mkdir(parents=True, exist_ok=True)
    costs, parts = out / "costs.csv", out / "components.csv"
    pd.DataFrame(layer_table(cost)).to_csv(costs, index=False)
    pd.DataFrame([part.row() for part in cost.parts]).to_csv(parts, index=False)
    return (("device", costs), ("device", parts))


STAGE = CostsStage()
