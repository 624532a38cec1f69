"""Options of the ONNX Runtime backend (`conf/backend/onnx.yaml`; typed schema `onnx_schema`)."""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from resnet8ptq.backends.base import BackendConfig


@dataclass
class OnnxRuntimeConfig(BackendConfig):
    """``native``: also run the model with all graph optimisations (ORT's fused integer kernels)."""


ConfigStore.instance().store(group="backend", name="onnx_schema", node=OnnxRuntimeConfig)
