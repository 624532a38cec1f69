"""One run, top to bottom: data -> FP32 model -> quantize -> evaluate -> log to MLflow."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from mlflow.data.numpy_dataset import NumpyDataset
from omegaconf import DictConfig, OmegaConf

from resnet8ptq import drawing, hardware, records
from resnet8ptq.algorithms import AlgoConfig, prepare
from resnet8ptq.artifacts import evaluation_files
from resnet8ptq.backends.base import KERAS_SOURCE, Backend, QuantizedModel
from resnet8ptq.config import quant_spec
from resnet8ptq.cost import configured_cost
from resnet8ptq.data import (
    BINARY_DIR,
    MD5_CACHE,
    PYTHON_DIR,
    Cifar10,
    calibration_indices,
    calibration_set,
    load_cifar10,
    to_model_input,
)
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.errors import ConfigError, ModelError
from resnet8ptq.evaluate import Baseline, Evaluation, evaluate_baseline
from resnet8ptq.execution import evaluate_quantized
from resnet8ptq.layers import (
    check_first_last,
    check_layer_bits,
    check_own_widths,
    check_raised,
    expected_raised,
    raised_in,
    sharing,
)
from resnet8ptq.mcu.config import McuConfig, mcu_settings
from resnet8ptq.mlperf import perf_subset_indices
from resnet8ptq.model import CanonicalModel, canonical_onnx, conversion_key, resolve_h5
from resnet8ptq.records import ModelRecord, Quantization, RunContext
from resnet8ptq.shared import Shared
from resnet8ptq.spec import QuantSpec
from resnet8ptq.tracking.identity import config_hash, git_commit, run_params
from resnet8ptq.tracking.models import content_digest, numpy_dataset
from resnet8ptq.tracking.runs import child_run, first_in_sweep, set_tags, skip_finished
from resnet8ptq.tracking.store import configure

if TYPE_CHECKING:  # TFLM and Vela load only for TFLite models
    from resnet8ptq.mcu.evaluate import McuResult

log = logging.getLogger(__name__)

LAYER_ERROR_IMAGES = 200  # calibration images used for the per-layer SQNR analysis


def run(
    cfg: DictConfig, output_dir: Path, extra_tags: Mapping[str, str] | None = None, *, shared: Shared
) -> str:
    """Quantize, evaluate and log one configuration (``extra_tags`` on its run); return the id of its run, or
    of the earlier FINISHED run of the same configuration that it resumes. ``shared``: what the runs of this
    process share (:mod:`resnet8ptq.shared`; a test passes its own)."""
    drawing.start()  # the charts' process starts up while the run sets up
    spec = quant_spec(cfg)  # invalid settings fail here, before any work
    algo: AlgoConfig = OmegaConf.to_object(cfg.algo)  # validated by quant_spec
    device: DeviceConfig = OmegaConf.to_object(cfg.device)  # validated by quant_spec
    mcu = mcu_settings(cfg.mcu)
    experiment_id = configure(cfg.mlflow)
    backend = make_backend(cfg, shared)
    params = run_params(cfg)
    backend.check(spec)  # a configuration the backend cannot run exactly is refused here, before any work
    backend.check_algorithms(algo.steps)
    run_name = name_of_run(backend.NAME, spec, algo, device)
    identity = result_identity(cfg, backend)
    extra_tags = dict(extra_tags or {})
    if spec.raised_layers or spec.layer_bits:  # names and widths checked before any work
        graph = onnx.load(fp32_model(cfg.model.path, cfg.model.sha256, Path(cfg.cache_dir)).onnx_path)
        check_raised(spec.raised_layers, graph, spec.dtype.activation_bits)
        check_layer_bits(spec, graph)
    if spec.raised_layers:  # the start configuration's hash groups the steps
        extra_tags["mixed_precision.base_hash"] = config_hash({**params, "raised_layers": []}, identity)
    tags = {
        "backend": backend.NAME,
        "quantized": "true",
        "calib": spec.calib.method,
        "algo": "+".join(algo.steps) or "none",
        "per_channel": str(spec.per_channel).lower(),
        "reduce_range": str(spec.reduce_range).lower(),
        "config_hash": config_hash(params, identity),
        "git_commit": git_commit(),
        **(device.tags() if device.enabled else {}),
    }
    quantization_key = config_hash(without_device(params), identity)
    resumable = not cfg.rerun and "unknown" not in identity.values()
    finished = skip_finished(experiment_id, run_name, tags["config_hash"]) if resumable else None
    if finished is not None:
        return finished  # resume: this configuration already FINISHED in an earlier run; no new run
    with child_run(experiment_id, run_name, tags | extra_tags, params) as run_id:
        # 1. Data: verified CIFAR-10, stratified calibration sample of the training split, MLPerf Tiny's
        #    performance subset of the test split.
        inputs = run_inputs(cfg, shared)

        # 2. FP32 model: the canonical ONNX (the .h5 for a backend that converts Keras itself), in this
        #    backend, with its accuracy as the baseline; published quantized models beside it.
        canonical = fp32_model(cfg.model.path, cfg.model.sha256, Path(cfg.cache_dir))
        source = source_path(backend, canonical, canonical.onnx_path)
        drawing.wait_started()  # its start-up over before anything is timed
        baseline = fp32_baseline(shared, backend, source, Path(cfg.cache_dir), inputs.data)
        context = {
            "data.verified": f"md5 ({inputs.data.layout} layout)",
            "model.sha256": canonical.h5_sha256,
            **{f"version.{lib}": version for lib, version in backend.versions().items()},
            **hardware.detect().tags(),
        }
        set_tags(run_id, context)
        fp32_record = model_record(
            cfg, backend, baseline.model.path, inputs.test_images, inputs.datasets.fp32
        )
        record = RunContext(experiment_id, params, tags | context, baseline, inputs.perf_subset, output_dir)
        records.log_baseline_once(record, backend.NAME, fp32_record)
        log_published_once(cfg, record, backend, inputs, mcu, device)

        # 3-4. PTQ algorithms on the FP32 model (`algo`), quantize, and evaluate on the full test set: the
        #      reference semantics, and the runtime form on this CPU. Device runs of one quantization (a
        #      sweep over `device.*`) quantize and evaluate it once, in the first of them.
        made = shared.quantized.get(quantization_key) if device.enabled else None
        if made is None:
            made = quantize_and_evaluate(cfg, backend, spec, algo, canonical, inputs, output_dir, run_name)
            if device.enabled:
                shared.quantized.put(quantization_key, made)
        else:
            set_tags(run_id, {"device.quantization_run": made.run_name})
            log.info("%s: reusing the quantized model of %s", run_name, made.run_name)
        prepared, quantized, result = made.prepared, made.quantized, made.result
        log.info(
            "%s: accuracy %.4f (FP32 %.4f); %s: %s",
            run_name,
            result.reference.accuracy,
            baseline.evaluation.accuracy,
            result.verdict.execution,
            result.verdict.reason,
        )
        # Its tables and charts (drawn in the drawing process while the run goes on).
        evaluation = evaluation_files(
            result.reference, output_dir / "evaluation", run_name, baseline.evaluation
        )
        # The quantizer's own error: against the FP32 model it was given (after the algorithms), timed.
        if made.layer_errors is None:
            made.layer_errors = []
            if cfg.layer_analysis:
                start = time.perf_counter()
                given = (
                    baseline.model
                    if not algo.steps
                    else backend.load_fp32(prepared.onnx_path, output_dir / "algo")
                )
                images = inputs.calibration_images[:LAYER_ERROR_IMAGES]
                made.layer_errors = backend.layer_errors(given, quantized, images)
                quantized.metrics["layer_analysis_seconds"] = time.perf_counter() - start

        # 5. The device (`device`): the saved model's integer form run as the device computes, every image.
        device_result = on_device(
            device, backend, quantized.path, inputs, result.reference.predictions, run_name, made.adc_profiles
        )

        # 6. The microcontroller (`mcu`; TFLite models): every test image in TFLite Micro against the
        #    reference kernels, the tensor arena and flash, the boards it fits, Vela's NPU estimate.
        mcu_result = on_mcu(cfg, mcu, backend, quantized.path, inputs, result.reference, run_name)

        # 7. Log.
        model = model_record(cfg, backend, quantized.path, inputs.test_images, inputs.datasets.quantized)
        records.log_quantized(record, run_id, run_name, cfg, made, evaluation, model)
        if device_result is not None:
            records.log_device(record, run_id, device_result, result.reference.predictions)
        if mcu_result is not None:
            records.log_mcu(run_id, mcu_result, output_dir)
    return run_id


def name_of_run(backend: str, spec: QuantSpec, algo: AlgoConfig, device: DeviceConfig) -> str:
    """A quantized run's name: backend, types, calibration, granularity, then what is not the default (the
    algorithms, raised or mixed layers, the device): ``onnx-int8-int8-minmax-pc-cle-cim-r128-adc4``."""
    granularity = ("pc" if spec.per_channel else "pt") + ("-rr" if spec.reduce_range else "")
    weights = "-wmse" if spec.calib.weights == "mse" else ""
    name = f"{backend}-{spec.dtype.label}-{spec.calib.method}{weights}-{granularity}"
    name += "".join(f"-{step}" for step in algo.steps)
    name += f"-raised{len(spec.raised_layers)}" if spec.raised_layers else ""
    name += f"-mix{len(spec.layer_bits)}" if spec.layer_bits else ""
    return name + (f"-{device.label}" if device.enabled else "")


def without_device(params: Mapping[str, object]) -> dict[str, object]:
    """The run's settings without the `device` group's: what its quantization depends on."""
    return {key: value for key, value in params.items() if key != "device" and not key.startswith("device.")}


def quantize_and_evaluate(
    cfg: DictConfig,
    backend: Backend,
    spec: QuantSpec,
    algo: AlgoConfig,
    canonical: CanonicalModel,
    inputs: RunInputs,
    output_dir: Path,
    run_name: str,
) -> Quantization:
    """The PTQ algorithms on the FP32 model (`algo`), the quantization, the check of its layers (raised,
    first and last), and the evaluation of both forms on the full test set."""
    calibration = inputs.calibration_images
    prepared = prepare(
        algo, canonical.onnx_path, calibration, spec, output_dir / "algo", cfg.data.seed, Path(cfg.cache_dir)
    )
    source = source_path(backend, canonical, prepared.onnx_path)
    quantized = backend.quantize(source, calibration, prepared.learned(spec), output_dir / "model")
    graph = onnx.load(prepared.onnx_path)
    shared = check_layers(quantized, spec, graph)
    first_last = check_first_last(quantized.layers, graph, spec)
    own = check_own_widths(quantized.layers, graph, spec)
    quantized.metrics |= configured_cost(graph, spec).metrics()  # the widths the checks above confirmed
    tolerance = cfg.native_tolerance_points
    result = evaluate_quantized(quantized, inputs.test_images, inputs.test_labels, run_name, tolerance)
    tags = {"dtype.first_last": first_last} if first_last else {}
    tags |= {"layer_bits": own} if own else {}
    return Quantization(run_name, prepared, quantized, shared, result, tags=tags)


def model_record(
    cfg: DictConfig, backend: Backend, path: Path, test_images: np.ndarray, datasets: dict[str, NumpyDataset]
) -> ModelRecord:
    """What logs the model at ``path`` with its datasets: as an MLflow Model (two test images as its input
    example) unless ``mlflow.log_models=false``, when only the datasets are logged (the model file is an
    artifact either way)."""
    flavor = backend.mlflow_flavor(path) if cfg.mlflow.log_models else None
    return ModelRecord(flavor, test_images[:2], datasets)


def check_layers(quantized: QuantizedModel, spec: QuantSpec, graph: onnx.ModelProto) -> dict[str, str]:
    """Fail unless the saved model holds exactly the requested layers (and those that take their
    quantization) at 16 bits; return which layer takes which one's quantization (layers.sharing)."""
    wide = set(raised_in(quantized.layers, spec.dtype.activation_bits))
    expected = expected_raised(spec.raised_layers, graph)
    if wide != expected:
        raise RuntimeError(
            f"The saved model holds {sorted(wide) or 'no layer'} at 16 bits; raised_layers asked for "
            f"{sorted(expected) or 'none'}."
        )
    return sharing(graph)


def make_backend(cfg: DictConfig, shared: Shared) -> Backend:
    """The configured backend (``cfg.backend._target_`` with its options), one instance per ``shared`` and
    settings: a multirun's jobs in one process share it and with it their FP32 baseline."""
    settings = OmegaConf.to_yaml(cfg.backend, resolve=True)
    threads = threads_per_run(cfg)
    try:
        return shared.get(
            "backend", (settings, threads), lambda: instantiate(OmegaConf.create(settings), threads=threads)
        )
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
        h5_sha256 = cfg.model.sha256 or resolve_h5(cfg.model.path, None, Path(cfg.cache_dir))[1]
        model = conversion_key(h5_sha256)
    except ModelError:
        model = "unknown"
    versions = {f"version.{lib}": version for lib, version in backend.versions().items()}
    return {"model": model, **versions, **mcu_identity(cfg, backend)}


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


def load_dataset(shared: Shared, root: str, download: bool, cache_dir: str) -> Cifar10:
    """CIFAR-10, verified and read once per ``shared`` (a multirun reuses it); the files' MD5s are kept in
    the cache directory until a file changes."""
    return shared.get(
        "dataset",
        (root, download, cache_dir),
        lambda: load_cifar10(Path(root), download=download, md5_cache=Path(cache_dir) / MD5_CACHE),
    )


@dataclass(frozen=True)
class LoggedDatasets:
    """The datasets a run logs as inputs: an FP32 run is evaluated on the test set, a quantized run also
    calibrated on the calibration sample."""

    fp32: dict[str, NumpyDataset]
    quantized: dict[str, NumpyDataset]


@dataclass(frozen=True)
class RunInputs:
    """What one run works on (:func:`run_inputs`): CIFAR-10, the test set as model input with its labels, the
    calibration sample (``per_class`` training images per class drawn with ``seed``), MLPerf Tiny's
    performance subset of the test set, and the datasets the run logs."""

    data: Cifar10
    test_images: np.ndarray
    test_labels: np.ndarray
    calibration_images: np.ndarray
    perf_subset: np.ndarray
    datasets: LoggedDatasets
    per_class: int
    seed: int

    def calibration_sample(self) -> dict[str, object]:
        """Which training images the calibration sample is, for a hardware team's export (crossbar.json)."""
        return {
            "split": "CIFAR-10 training batches data_batch_1..5, concatenated in file order (50,000 images)",
            "per_class": self.per_class,
            "seed": self.seed,
            "indices": calibration_indices(self.data.train_labels, self.per_class, self.seed).tolist(),
            "images": "NHWC raw 0-255 pixels as the model takes them (no normalisation)",
        }


def run_inputs(cfg: DictConfig, shared: Shared) -> RunInputs:
    """The run's :class:`RunInputs`: verified CIFAR-10, the stratified calibration sample of the training
    split, MLPerf Tiny's performance subset of the test split (the data, test set and datasets kept in
    ``shared``)."""
    data = load_dataset(shared, cfg.data.root, cfg.data.download, cfg.cache_dir)
    per_class, seed = cfg.data.calib_per_class, cfg.data.seed
    test_images, test_labels = test_set(shared, data)
    calibration_images, _ = calibration_set(data, per_class, seed)
    datasets = shared.get(
        "run_inputs", (data, per_class, seed), lambda: logged_datasets(shared, data, per_class, seed)
    )
    perf_subset = perf_subset_indices(Path(cfg.cache_dir))
    return RunInputs(
        data, test_images, test_labels, calibration_images, perf_subset, datasets, per_class, seed
    )


def logged_datasets(shared: Shared, data: Cifar10, per_class: int, seed: int) -> LoggedDatasets:
    """The test set and the calibration sample as MLflow datasets (digests from their contents)."""
    source = str(data.root / (BINARY_DIR if data.layout == "binary" else PYTHON_DIR))
    images, labels = test_set(shared, data)
    test = numpy_dataset("cifar10-test", images, labels, source, content_digest(images, labels))
    images, labels = calibration_set(data, per_class, seed)
    name = f"cifar10-train-calibration-{per_class}x10-seed{seed}"
    calibration = numpy_dataset(name, images, labels, source, content_digest(images, labels))
    return LoggedDatasets({"evaluation": test}, {"evaluation": test, "calibration": calibration})


def test_set(shared: Shared, data: Cifar10) -> tuple[np.ndarray, np.ndarray]:
    """All 10,000 test images as model input, with their labels (once per ``shared`` and dataset)."""
    return shared.get("test_set", (data,), lambda: (to_model_input(data.test_images), data.test_labels))


def source_path(backend: Backend, canonical: CanonicalModel, onnx_path: Path) -> Path:
    """The FP32 file the backend starts from (:attr:`Backend.SOURCE`): ``onnx_path`` (the canonical ONNX
    model, or the `algo` steps' transform of it), or the .h5 for a backend that converts Keras itself."""
    return canonical.h5_path if backend.SOURCE == KERAS_SOURCE else onnx_path


def on_device(
    device: DeviceConfig,
    backend: Backend,
    path: Path,
    inputs: RunInputs,
    reference_predictions: np.ndarray,
    name: str,
    adc_profiles: dict | None = None,
) -> records.OnDevice | None:
    """The model at ``path`` on the run's ``device`` (its integer form, every test image, the ADC ranges from
    the run's calibration sample; ``adc_profiles``: :func:`resnet8ptq.device.evaluate.adc_steps`); None
    unless ``device.enabled``."""
    if not device.enabled:
        return None
    from resnet8ptq.device.evaluate import evaluate_device  # torch: only for device runs

    integer = backend.integer_model(path)
    result = evaluate_device(
        integer, device, inputs.test_images, inputs.test_labels, inputs.calibration_images,
        reference_predictions, inputs.perf_subset, name, adc_profiles,
    )  # fmt: skip
    log.info(
        "%s: accuracy on device %s %.4f (%d predictions differ from the reference)",
        name, device.label, result.accuracy, result.differing_from_reference,
    )  # fmt: skip
    return records.OnDevice(result, integer, inputs.test_images, inputs.calibration_sample())


def log_published_once(
    cfg: DictConfig,
    record: RunContext,
    backend: Backend,
    inputs: RunInputs,
    mcu: McuConfig,
    device: DeviceConfig,
) -> None:
    """Evaluate each quantized model published for the backend's format (:meth:`Backend.published_models`)
    on the test set like the backend's own (on the microcontroller path and the run's ``device`` too), and
    log it as a run of its own, once per sweep (on the device of the sweep's run that logs it first)."""
    for name, published in backend.published_models(Path(cfg.cache_dir)).items():
        with first_in_sweep(record.experiment_id, **{records.REFERENCE_TAG: name}) as first:
            if not first:
                continue
            tolerance = cfg.native_tolerance_points
            images, labels = inputs.test_images, inputs.test_labels
            result = evaluate_quantized(published, images, labels, f"{name} (published)", tolerance)
            model = model_record(cfg, backend, published.path, images, inputs.datasets.fp32)
            on_mcu_result = on_mcu(cfg, mcu, backend, published.path, inputs, result.reference, name)
            device_result = on_device(
                device, backend, published.path, inputs, result.reference.predictions, f"{name} (published)"
            )
            records.log_published(record, name, published, result, model, on_mcu_result, device_result)


def on_mcu(
    cfg: DictConfig,
    mcu: McuConfig,
    backend: Backend,
    path: Path,
    inputs: RunInputs,
    reference: Evaluation,
    name: str,
) -> McuResult | None:
    """The model at ``path`` on the microcontroller path, compared with its ``reference`` evaluation on
    the test images (LiteRT's reference kernels); None unless the backend's models run in TFLite Micro and
    ``mcu.enabled``."""
    if not (mcu.enabled and backend.MCU):
        return None
    from resnet8ptq.mcu.evaluate import evaluate_mcu  # TFLM and Vela: only for TFLite models

    result = evaluate_mcu(
        path, mcu, inputs.test_images, reference.labels, reference.probabilities, inputs.perf_subset,
        Path(cfg.cache_dir), threads_per_run(cfg), f"{name}: TFLite Micro",
    )  # fmt: skip
    log.info(
        "%s: TFLite Micro accuracy %.4f; %s; arena %d bytes, flash %d bytes; fits %s",
        name,
        result.accuracy,
        result.comparison(),
        result.arena.recorded,
        result.flash_bytes,
        ", ".join(fit.name for fit in result.fits if fit.fits) or "no board",
    )
    return result


def fp32_model(path: str | None, sha256: str | None, cache_dir: Path) -> CanonicalModel:
    """The canonical FP32 ONNX model (converted from the Keras .h5 once, then cached on disk)."""
    h5, actual_sha256 = resolve_h5(path, sha256, cache_dir)
    return canonical_onnx(h5, actual_sha256, cache_dir)


def fp32_baseline(
    shared: Shared, backend: Backend, onnx_path: Path, cache_dir: Path, data: Cifar10
) -> Baseline:
    """The backend's FP32 model evaluated on the test set, once per ``shared``, backend instance (see
    make_backend), model file and dataset."""

    def evaluate() -> Baseline:
        model = backend.load_fp32(onnx_path, cache_dir / backend.NAME)
        return evaluate_baseline(model, *test_set(shared, data), f"{backend.NAME}-fp32")

    return shared.get("baseline", (backend, onnx_path, cache_dir, data), evaluate)
