"""One configuration resolved before any work (:func:`resolve`): its typed settings, its backend, its name,
tags and hashes, and every check that can refuse it. Bad settings fail here, before a run exists."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from resnet8ptq import hardware
from resnet8ptq.algorithms import AlgoConfig
from resnet8ptq.backends.base import KERAS_SOURCE, Backend
from resnet8ptq.components.config import ComponentsConfig
from resnet8ptq.config import quant_spec
from resnet8ptq.device.config import DeviceConfig, learned_settings
from resnet8ptq.errors import ConfigError, ModelError, Unsupported
from resnet8ptq.fetch import sha256_of
from resnet8ptq.layers import check_layer_bits, check_raised
from resnet8ptq.mcu.config import McuConfig, mcu_settings
from resnet8ptq.model import CanonicalModel, canonical_onnx, conversion_key, resolve_source
from resnet8ptq.model_formats import KERAS_SUFFIXES
from resnet8ptq.shared import Shared
from resnet8ptq.spec import QuantSpec
from resnet8ptq.tracking.identity import config_hash, git_commit, run_params
from resnet8ptq.tracking.store import configure


@dataclass(frozen=True)
class Plan:
    """A configuration resolved (:func:`resolve`): the Hydra config and its typed views, the experiment and
    backend, the run's name, params and tags, and the keys that find an earlier run of it (``config_hash``)
    or of its quantization (``quantization_key``: the hash without the device settings)."""

    cfg: DictConfig
    spec: QuantSpec
    algo: AlgoConfig
    device: DeviceConfig
    mcu: McuConfig
    experiment_id: str
    backend: Backend
    name: str
    params: dict[str, object]
    identity: dict[str, str]
    tags: dict[str, str]  # the quantized run's
    extra_tags: dict[str, str]  # the caller's, and a mixed-precision search's base hash
    quantization_key: str
    components: ComponentsConfig = field(default_factory=ComponentsConfig)  # what a device run costs

    @property
    def resumable(self) -> bool:
        """A FINISHED run of the same configuration may stand for this one: not ``rerun``, and everything
        that decides the result is known."""
        return not self.cfg.rerun and "unknown" not in self.identity.values()


def resolve(cfg: DictConfig, extra_tags: Mapping[str, str] | None, shared: Shared) -> Plan:
    """``cfg`` resolved, every setting checked (types, values, what the backend can run, raised and mixed
    layers' names and widths), before any work."""
    spec = quant_spec(cfg)  # invalid settings fail here
    algo: AlgoConfig = OmegaConf.to_object(cfg.algo)  # validated by quant_spec
    device: DeviceConfig = OmegaConf.to_object(cfg.device)  # validated by quant_spec
    mcu = mcu_settings(cfg.mcu)
    experiment_id = configure(cfg.mlflow)
    backend = make_backend(cfg, shared)
    params = run_params(cfg)
    check_source(cfg.model, backend)
    backend.check(spec)  # a configuration the backend cannot run exactly is refused here
    backend.check_algorithms(algo.steps)
    identity = result_identity(cfg, backend)
    extra = dict(extra_tags or {})
    if spec.raised_layers or spec.layer_bits:  # names and widths checked before any work
        graph = onnx.load(fp32_model(cfg.model, Path(cfg.cache_dir)).onnx_path)
        check_raised(spec.raised_layers, graph, spec.dtype.activation_bits)
        check_layer_bits(spec, graph)
    if spec.raised_layers:  # the start configuration's hash groups the steps
        extra["mixed_precision.base_hash"] = config_hash({**params, "raised_layers": []}, identity)
    tags = {
        "backend": backend.NAME,
        "quantized": "true",
        "calib": spec.calib.method,
        "algo": "+".join(algo.steps) or "none",
        **({"algo.device_aware": "true"} if algo.device_aware else {}),
        **({"algo.device_noise": "true"} if algo.device_noise else {}),
        "per_channel": str(spec.per_channel).lower(),
        "reduce_range": str(spec.reduce_range).lower(),
        "config_hash": config_hash(params, identity),
        "git_commit": git_commit(),
        **(device.tags() if device.enabled else {}),
        **chip_tag(),
    }
    components: ComponentsConfig = OmegaConf.to_object(cfg.components)  # validated by quant_spec
    name = name_of_run(backend.NAME, spec, algo, device, cfg.model.name, components)
    key = config_hash(without_device(params, learned_on(algo)), identity)
    return Plan(
        cfg,
        spec,
        algo,
        device,
        mcu,
        experiment_id,
        backend,
        name,
        params,
        identity,
        tags,
        extra,
        key,
        components,
    )


def check_source(model: DictConfig, backend: Backend) -> None:
    """Refuse a backend whose converter reads Keras models (:attr:`Backend.SOURCE`) a model of another format,
    by the file's suffix (:mod:`resnet8ptq.model_formats`): ``Unsupported``, so that a sweep over networks and
    toolchains skips that pair and goes on, as it does a configuration a backend cannot make."""
    name = model.path or model.asset
    if backend.SOURCE == KERAS_SOURCE and name and Path(name).suffix.lower() not in KERAS_SUFFIXES:
        raise Unsupported(
            f"backend={backend.NAME} converts Keras models (.h5, .keras) with its own converter; "
            f"model={model.name} is {Path(name).name}. Give the model's Keras file (model.path=...), or "
            "choose backend=onnx or backend=torch."
        )


def chip_tag() -> dict[str, str]:
    """``device.chip``: the chip preset (``device/chip=...``, conf/device/chip/) the device's settings came
    from, when one was chosen."""
    if not HydraConfig.initialized():
        return {}
    chip = HydraConfig.get().runtime.choices.get("device/chip")
    return {"device.chip": chip} if chip else {}


def name_of_run(
    backend: str,
    spec: QuantSpec,
    algo: AlgoConfig,
    device: DeviceConfig,
    model: str = "resnet8",
    components: ComponentsConfig | None = None,
) -> str:
    """A quantized run's name: the network unless ResNet8, backend, types, calibration, granularity, then what
    is not the default (the algorithms, ``-aware`` when they learned against the device, ``-noisy`` on noisy
    chips, raised or mixed layers, the device):
    ``onnx-int8-int8-minmax-pc-cle-cim-r128-adc4``,
    ``onnx-int8-int8-minmax-pc-brecq-aware-cim-r128-adc4-learned``; a device run's costing settings away
    from their defaults after it (``...-cim-r256-adc5-gated``)."""
    granularity = ("pc" if spec.per_channel else "pt") + ("-rr" if spec.reduce_range else "")
    weights = "-wmse" if spec.calib.weights == "mse" else ""
    name = f"{backend}-{spec.dtype.label}-{spec.calib.method}{weights}-{granularity}"
    name = name if model == "resnet8" else f"{model}-{name}"
    name += "".join(f"-{step}" for step in algo.steps) + ("-aware" if algo.device_aware else "")
    name += "-noisy" if algo.device_noise else ""
    name += f"-raised{len(spec.raised_layers)}" if spec.raised_layers else ""
    name += f"-mix{len(spec.layer_bits)}" if spec.layer_bits else ""
    costed = components.label(device.kind) if components is not None and components.enabled else ""
    return (
        name
        + (f"-{device.label}" if device.enabled else "")
        + (f"-{costed}" if device.enabled and costed else "")
    )


def without_device(params: Mapping[str, object], keep: tuple[str, ...] = ()) -> dict[str, object]:
    """The run's settings without the `device` and `components` groups' but ``keep`` (``device.<name>``):
    what its quantization depends on."""
    kept = {f"device.{name}" for name in keep}
    groups = ("device", "components")
    return {
        key: value
        for key, value in params.items()
        if key in kept or (key not in groups and not key.startswith(tuple(f"{g}." for g in groups)))
    }


def learned_on(algo: AlgoConfig) -> tuple[str, ...]:
    """The device settings a quantization depends on: those device-aware learning sees, else none."""
    return learned_settings(algo.device_noise) if algo.device_aware else ()


def make_backend(cfg: DictConfig, shared: Shared) -> Backend:
    """The configured backend (``cfg.backend._target_`` with its options), one instance per ``shared`` and
    settings: a multirun's jobs in one process share it and with it their FP32 baseline."""
    settings = OmegaConf.to_yaml(cfg.backend, resolve=True)
    threads = threads_per_run(cfg)

    def build() -> Backend:
        backend = instantiate(OmegaConf.create(settings), threads=threads)
        backend.cache_dir = Path(cfg.cache_dir)
        return backend

    try:
        return shared.get("backend", (settings, threads, cfg.cache_dir), build)
    except InstantiationException as err:
        missing = next((e for e in _causes(err) if isinstance(e, ImportError)), None)
        if missing is None:
            raise
        extra = cfg.backend._target_.split(".")[2]
        raise ConfigError(
            f"{cfg.backend._target_} needs packages that are not installed ({missing}). "
            f"Install them with: pip install -e '.[{extra}]'"
        ) from err


def _causes(err: BaseException) -> list[BaseException]:
    chain = []
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def result_identity(cfg: DictConfig, backend: Backend) -> dict[str, str]:
    """Besides the settings, what decides a run's result (part of its config_hash): the canonical model (the
    .h5's actual sha256 with the converter versions), the backend's library versions, and for TFLite models
    the microcontroller path's settings.

    Determined before the run, best effort: what cannot be determined yet is "unknown" (the run then fails
    with the reason; it is never skipped).
    """
    try:
        sha256 = cfg.model.sha256 or source_file(cfg.model, Path(cfg.cache_dir), check=False)[1]
        model = conversion_key(sha256)
    except ModelError:
        model = "unknown"
    versions = {f"version.{lib}": version for lib, version in backend.versions().items()}
    return {"model": model, **data_identity(cfg.data), **versions, **mcu_identity(cfg, backend)}


def data_identity(data: DictConfig) -> dict[str, str]:
    """What decides the data besides its settings: a user's arrays by their file's sha256 (CIFAR-10 is
    checked against its official checksums, so its settings say all); "unknown" for a file not found."""
    if data.name != "npz":
        return {}
    path = Path(data.path).expanduser()
    return {"data": sha256_of(path) if path.is_file() else "unknown"}


def mcu_identity(cfg: DictConfig, backend: Backend) -> dict[str, str]:
    """What the microcontroller path adds to a TFLite run's result (its settings, the boards, the TFLM and
    Vela versions): a run made without it, or with other boards, is not reused. Nothing for other backends."""
    if not (backend.MCU and cfg.mcu.enabled):
        return {}
    from resnet8ptq.mcu import tflm, vela  # numpy only: tflite_micro loads when a model runs

    settings = OmegaConf.to_container(cfg.mcu, resolve=True)
    versions = {"tflite-micro": tflm.version(), "ethos-u-vela": vela.version()}
    return {"mcu": json.dumps({**settings, **versions}, sort_keys=True)}


def threads_per_run(cfg: DictConfig) -> int:
    """``cfg.threads``, else the cores this process may use (its CPU affinity: ``hardware.usable_cores``)
    divided among the launcher's parallel jobs."""
    if cfg.threads:
        return cfg.threads
    n_jobs = HydraConfig.get().launcher.get("n_jobs") if HydraConfig.initialized() else None
    cores = hardware.usable_cores()
    if not n_jobs or n_jobs == 1:
        return cores
    return max(1, cores // (cores if n_jobs < 0 else n_jobs))


def source_file(model: DictConfig, cache_dir: Path, check: bool = True) -> tuple[Path, str]:
    """The `model` group's file and its actual sha256 (checked against ``model.sha256`` with ``check``)."""
    sha256 = model.sha256 if check else None
    return resolve_source(model.path, sha256, cache_dir, model.asset, model.url)


def fp32_model(model: DictConfig, cache_dir: Path) -> CanonicalModel:
    """The `model` group's canonical FP32 ONNX model (converted once, then cached on disk)."""
    source, sha256 = source_file(model, cache_dir)
    return canonical_onnx(source, sha256, cache_dir, model.name)
