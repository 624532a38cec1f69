"""Stage ``mcu`` (`mcu`; TFLite models): every test image in TFLite Micro against LiteRT's reference
kernels, the tensor arena and flash, the boards it fits, Vela's NPU estimate."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from resnet8ptq import records
from resnet8ptq.backends.base import Backend
from resnet8ptq.evaluate import Evaluated
from resnet8ptq.inputs import RunInputs
from resnet8ptq.mcu.config import McuConfig
from resnet8ptq.resolve import Plan, threads_per_run
from resnet8ptq.stages import RunRecord, Stage

if TYPE_CHECKING:  # TFLM and Vela load only for TFLite models
    from resnet8ptq.mcu.evaluate import McuResult

log = logging.getLogger(__name__)


class McuStage(Stage):
    name = "mcu"
    order = 50

    def enabled(self, plan: Plan) -> bool:
        return plan.mcu.enabled and plan.backend.MCU

    def run(self, inputs: RunInputs, record: RunRecord) -> McuResult | None:
        plan, made = record.plan, record["quantize"].made
        model = Evaluated(plan.name, made.quantized.path, made.result.reference)
        return on_mcu(plan.cfg, plan.mcu, plan.backend, model, inputs)

    def log(self, inputs: RunInputs, record: RunRecord, result: McuResult) -> None:
        records.log_mcu(record.run_id, result, record.output_dir)


STAGE = McuStage()


def on_mcu(
    cfg: DictConfig, mcu: McuConfig, backend: Backend, model: Evaluated, inputs: RunInputs
) -> McuResult | None:
    """``model`` on the microcontroller path, compared with its reference evaluation on the test images
    (LiteRT's reference kernels); None unless the backend's models run in TFLite Micro and ``mcu.enabled``."""
    if not (mcu.enabled and backend.MCU):
        return None
    from resnet8ptq.mcu.evaluate import evaluate_mcu  # TFLM and Vela: only for TFLite models

    result = evaluate_mcu(model, mcu, inputs, Path(cfg.cache_dir), threads_per_run(cfg))
    log.info(
        "%s: TFLite Micro %s %.4f; %s; arena %d bytes, flash %d bytes; fits %s",
        model.name,
        result.metric.title,
        result.accuracy,
        result.comparison(),
        result.arena.recorded,
        result.flash_bytes,
        ", ".join(fit.name for fit in result.fits if fit.fits) or "no board",
    )
    return result
