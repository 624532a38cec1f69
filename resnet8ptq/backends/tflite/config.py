"""Options of the TensorFlow Lite backend (`conf/backend/tflite.yaml`; typed schema `tflite_schema`)."""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from resnet8ptq.backends.base import BackendConfig


@dataclass
class TFLiteConfig(BackendConfig):
    """``native``: also run the model with LiteRT's default kernels (XNNPACK delegate, optimized built-ins).
    ``mlperf_reference``: log MLPerf Tiny's own int8 .tflite as a reference run once per sweep."""

    mlperf_reference: bool = True


ConfigStore.instance().store(group="backend", name="tflite_schema", node=TFLiteConfig)
