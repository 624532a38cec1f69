"""The typed schema of the Hydra config: one dataclass per config group or section, registered in Hydra's
ConfigStore, so that a wrong type fails at composition and a bad value (``quant_spec``) before any work.

Group schemas live with the code they configure: ``dtype`` in :mod:`resnet8ptq.dtype`, ``calib`` in
:mod:`resnet8ptq.calibration`, each backend's in ``resnet8ptq/backends/<name>/config.py`` (found by
:func:`register_backend_schemas`, so adding a backend edits nothing here).
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import resnet8ptq.backends
from resnet8ptq.algorithms import AlgoConfig
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.components.config import ComponentsConfig, uncovered
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.device.coverage import check_learnable
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.errors import ConfigError
from resnet8ptq.fetch import ASSETS_ENV
from resnet8ptq.mcu.config import McuConfig
from resnet8ptq.model import MODEL_FILENAME, MODEL_SHA256, MODEL_URL
from resnet8ptq.search.objectives import SearchConfig
from resnet8ptq.search.target import TargetConfig
from resnet8ptq.spec import QuantSpec


@dataclass
class DataConfig:
    """The data a run calibrates and evaluates on (`data` group, conf/data/; :mod:`resnet8ptq.datasets`).
    ``cifar10``: ``root`` holds ``cifar-10-batches-bin/`` (or ``-py/``), downloaded there when absent
    ($RESNET8PTQ_ASSETS points at an existing copy). ``npz``: a user's arrays in one ``.npz`` file (``path``;
    its keys in docs/usage.md)."""

    name: str = "cifar10"  # cifar10 | npz
    root: str = f"${{oc.env:{ASSETS_ENV},data}}"  # cifar10: holds cifar-10-batches-bin/ (downloaded there)
    download: bool = True  # fetch CIFAR-10 (checksummed) where root lacks it; false: an error instead
    calib_per_class: int = 100  # calibration images per class, drawn from the TRAINING split (cifar10)
    seed: int = 42  # the calibration sample's draw (and AdaRound's batches)
    path: str | None = None  # npz: the arrays' file


@dataclass
class ModelConfig:
    """The network (`model` group, conf/model/): its file, where it is published, its classes and MLPerf
    Tiny's quality target. ``model=custom model.path=FILE`` takes a user's own
    (:mod:`resnet8ptq.model_formats`)."""

    name: str = "resnet8"  # names the canonical model in the cache and the runs (tag `model`)
    path: str | None = None  # the model file (.h5, .keras, float .tflite, .onnx); null: the published one
    sha256: str | None = MODEL_SHA256  # the file's sha256 (MLPerf Tiny's pretrainedResnet.h5); null: any
    asset: str | None = MODEL_FILENAME  # the published file under $RESNET8PTQ_ASSETS/models/ and the cache's
    url: str | None = MODEL_URL  # where the published file is downloaded from when no copy is found
    classes: list[str] = field(default_factory=lambda: list(CLASS_NAMES))  # label order; []: the data's
    metric: str = "top1"  # how its outputs are scored (resnet8ptq/metrics.py): top1, or auc (an autoencoder)
    quality_target: float | None = 0.85  # MLPerf Tiny's closed-division target, in the metric's units
    published_reference: bool = True  # also evaluate MLPerf Tiny's own int8 model of it (TFLite backend)


@dataclass
class MlflowConfig:
    tracking_uri: str | None = None  # null: MLflow's default (sqlite:///mlflow.db in the working directory)
    experiment: str = "resnet8ptq"  # the MLflow experiment the runs go to
    register_as: str | None = None  # register the sweep's most accurate model under this name
    log_models: bool = True  # each run's model as an MLflow Model (false: the model file as an artifact only)


@dataclass
class ReportConfig:
    """The comparison report written at the end of every run and sweep (:mod:`resnet8ptq.report`)."""

    enabled: bool = True  # write the report after every run and sweep
    max_drop_points: float = 5.0  # configurations losing more accuracy (points vs FP32) are flagged
    chip_drop_points: float = 1.0  # the cheapest costed chip: within this many points of the integer device


@dataclass
class Config:
    """Every setting and its default: the single place defaults are written (``conf/config.yaml`` holds
    the groups' default choices and Hydra's settings; the group YAMLs only what their choice changes).
    ``python run.py --cfg job`` prints the composed config; docs/usage.md lists every setting."""

    backend: Any = MISSING  # the chosen backend's own schema (`<name>_schema`) types it
    dtype: DtypeConfig = MISSING  # the `dtype` group's choice
    calib: CalibConfig = MISSING  # the `calib` group's choice
    algo: AlgoConfig = MISSING  # the `algo` group's choice
    device: DeviceConfig = MISSING  # the `device` group's choice
    components: ComponentsConfig = MISSING  # the `components` group's choice: what a device run costs
    per_channel: bool = False  # per-output-channel weight scales
    reduce_range: bool = False  # weights in 7 bits (ORT's reduce_range): no u8s8 saturation without VNNI
    raised_layers: list[str] = field(default_factory=list)  # layers at 16 bits, named as in layer_sqnr.csv
    layer_bits: dict[str, int] = field(default_factory=dict)  # layers of their own width (2..8), e.g. a mix
    native_tolerance_points: float = 0.3  # largest |native - reference| accuracy gap tagged `native`
    layer_analysis: bool = True  # per-layer SQNR of every quantized run (analysis/layer_sqnr.csv, sqnr_*)
    threads: int | None = None  # compute threads per run; null: the cores divided among parallel jobs
    rerun: bool = False  # run configurations that already have a FINISHED run with the same config_hash
    data: DataConfig = field(default_factory=DataConfig)  # the `data` group's choice: what it runs on
    model: ModelConfig = field(default_factory=ModelConfig)  # the `model` group's choice: the network
    cache_dir: str = "${oc.env:RESNET8PTQ_CACHE,${oc.env:HOME}/.cache/resnet8ptq}"  # converted models
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    search: SearchConfig = field(default_factory=SearchConfig)  # what a search returns (objectives)
    target: TargetConfig = field(default_factory=TargetConfig)  # mixed precision to an accuracy drop
    mcu: McuConfig = field(default_factory=McuConfig)  # TFLite Micro, boards, NPU estimate (TFLite models)


def register_backend_schemas() -> None:
    """Import ``resnet8ptq/backends/<name>/config.py`` of every backend package; each registers its schema."""
    for module in pkgutil.iter_modules(resnet8ptq.backends.__path__):
        if module.ispkg:
            importlib.import_module(f"{resnet8ptq.backends.__name__}.{module.name}.config")


ConfigStore.instance().store(name="base_config", node=Config)


def job_dirname(overrides: str, limit: int = 120) -> str:
    """A sweep job's directory name from its overrides (``hydra.job.override_dirname``; resolver
    ``job_dirname`` in ``conf/config.yaml``): slashes (layer names) made underscores, and a name too long for
    a file system (255 bytes) cut, with a hash of the whole so that jobs stay apart."""
    name = overrides.replace("/", "_")
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{name.encode()[: limit - 13].decode(errors='ignore')}-{digest}"


OmegaConf.register_new_resolver("job_dirname", job_dirname, replace=True)
OmegaConf.register_new_resolver(
    "package_file", lambda relative: str(Path(resnet8ptq.__file__).parent / relative), replace=True
)  # a file shipped in the package: conf/model/dscnn.yaml's network
register_backend_schemas()


def quant_spec(cfg: DictConfig) -> QuantSpec:
    """The quantization settings of a composed config, validated: ConfigError names the bad setting."""
    if cfg.native_tolerance_points < 0:
        raise ConfigError(
            f"native_tolerance_points={cfg.native_tolerance_points}: expected a number of points >= 0."
        )
    if cfg.threads is not None and cfg.threads < 1:
        raise ConfigError(
            f"threads={cfg.threads}: expected a positive number of threads, or null (all cores)."
        )
    if cfg.target.max_drop_points is not None and not cfg.layer_analysis:
        raise ConfigError(
            f"target.max_drop_points={cfg.target.max_drop_points} with layer_analysis=false: the "
            "mixed-precision steps raise the layers the per-layer analysis ranks worst. "
            "Set layer_analysis=true."
        )
    try:
        for section in (cfg.algo, cfg.search, cfg.target):  # validated here with the rest, used elsewhere
            OmegaConf.to_object(section)
        spec = QuantSpec(
            dtype=OmegaConf.to_object(cfg.dtype),
            calib=OmegaConf.to_object(cfg.calib),
            per_channel=cfg.per_channel,
            reduce_range=cfg.reduce_range,
            raised_layers=tuple(cfg.raised_layers),
            layer_bits=tuple(sorted(cfg.layer_bits.items())),
        )
        device = OmegaConf.to_object(cfg.device)
        check_device(device, spec)
        check_device_aware(OmegaConf.to_object(cfg.algo), device, spec)
        check_components(OmegaConf.to_object(cfg.components), device)
        return spec
    except ValueError as err:
        raise ConfigError(str(err)) from err


def check_components(components: ComponentsConfig, device: DeviceConfig) -> None:
    """With ``components.required=true``, fail unless the component models cover ``device``
    (:func:`~resnet8ptq.components.config.uncovered`)."""
    reason = uncovered(components, device) if components.required else None
    if reason is not None:
        raise ValueError(
            f"components.required=true: {reason}; or components.required=false (runs go on "
            "without costs) or components=none."
        )


def check_device_aware(algo: AlgoConfig, device: DeviceConfig, spec: QuantSpec) -> None:
    """Fail unless device-aware learning and the learned ADC range come together, on a crossbar the learning
    can model (:func:`~resnet8ptq.device.coverage.check_learnable`), with symmetric weights (whose grid the
    backends, computing it again from the learned weights, find exactly: the learned ADC steps find their
    layers by its integers)."""
    if device.range_rule == "learned" and not algo.device_aware:
        raise ValueError(
            "device.adc_range=learned takes the ADC steps that device-aware learning learned; set "
            "algo.device_aware=true with an algorithm that learns them (algo=brecq or algo=qdrop)."
        )
    if not algo.device_aware:
        return
    if device.kind != "cim":
        raise ValueError(
            f"algo.device_aware=true with device={device.kind}: the learning needs the crossbar it learns "
            "against; set device=cim with its settings (e.g. device.rows=128 device.adc_bits=4)."
        )
    if not spec.dtype.weight_symmetric(spec.per_channel):
        raise ValueError(
            f"algo.device_aware=true with dtype.weight={spec.dtype.weight}: asymmetric weight grids are "
            "computed again by the backends from the learned weights and may store other integers than "
            "learned; use int8 weights (dtype=int8 or u8s8)."
        )
    check_learnable(device.crossbar())
    if algo.device_noise and not device.draws_cells():
        raise ValueError(
            "algo.device_noise=true draws the chip's cell effects while learning, and this crossbar has "
            "none; set device.weight_noise, device.stuck_off/stuck_on, device.drift or device.charge_loss "
            "(or a chip preset: device/chip=...), or leave algo.device_noise=false."
        )


def check_device(device: DeviceConfig, spec: QuantSpec) -> None:
    """Fail unless the `device` can run models of ``spec``: 8-bit activations only (no 16-bit layers yet),
    and cells that hold the weights' magnitude."""
    if not device.enabled:
        return
    if spec.dtype.activation_bits == 16 or spec.raised_layers:
        raise ValueError(
            f"device={device.kind} with 16-bit activations (dtype.activation_bits="
            f"{spec.dtype.activation_bits}, raised_layers={list(spec.raised_layers)}): the integer form "
            "covers 8-bit activations only."
        )
    # The widest weights must fit the cells: the first and last layers' (dtype.first_last_bits) when set,
    # and any of their own width (layer_bits; an activation's width never exceeds 8 here).
    widest = max(spec.dtype.weight_bits, spec.dtype.first_last_bits or 0, *(b for _, b in spec.layer_bits))
    device.check_weights(spec.dtype.weight, widest)
