"""Options of the PyTorch backend (`conf/backend/torch.yaml`; typed schema `torch_schema`)."""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from resnet8ptq.backends.base import BackendConfig


@dataclass
class TorchBackendConfig(BackendConfig):
    """``native``: compile uint8/int8 models into inductor's oneDNN int8 kernels as their runtime form."""


ConfigStore.instance().store(group="backend", name="torch_schema", node=TorchBackendConfig)
