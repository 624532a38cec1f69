"""One run, top to bottom: resolve the configuration -> data -> FP32 model -> algorithms -> quantize ->
evaluate (+ layer errors, device, microcontroller) -> log to MLflow. Each step is a function below ``run``."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from mlflow.data.numpy_dataset import NumpyDataset
from omegaconf import DictConfig

from resnet8ptq import drawing, hardware, records
from resnet8ptq.algorithms import prepare
from resnet8ptq.artifacts import evaluation_files
from resnet8ptq.backends.base import KERAS_SOURCE, Backend, QuantizedModel
from resnet8ptq.cost import configured_cost
from resnet8ptq.data import Cifar10
from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.evaluate import Baseline, Evaluation, evaluate_baseline
from resnet8ptq.execution import evaluate_quantized
from resnet8ptq.inputs import RunInputs, run_inputs, test_set
from resnet8ptq.layers import check_first_last, check_own_widths, expected_raised, raised_in, sharing
from resnet8ptq.mcu.config import McuConfig
from resnet8ptq.model import CanonicalModel
from resnet8ptq.records import ModelRecord, Quantization, RunContext
from resnet8ptq.resolve import Plan, fp32_model, resolve, threads_per_run
from resnet8ptq.shared import Shared
from resnet8ptq.spec import QuantSpec
from resnet8ptq.tracking.runs import child_run, first_in_sweep, set_tags, skip_finished

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
    plan = resolve(cfg, extra_tags, shared)  # bad settings fail here, before any work
    finished = (
        skip_finished(plan.experiment_id, plan.name, plan.tags["config_hash"]) if plan.resumable else None
    )
    if finished is not None:
        return finished  # resume: this configuration already FINISHED in an earlier run; no new run
    with child_run(plan.experiment_id, plan.name, plan.tags | plan.extra_tags, plan.params) as run_id:
        # 1. Data: verified CIFAR-10, the stratified calibration sample of the training split, MLPerf Tiny's
        #    performance subset of the test split.
        inputs = run_inputs(cfg, shared)
        # 2. The FP32 model in this backend and its baseline, published quantized models beside it.
        fp32 = fp32_stage(plan, inputs, shared, run_id, output_dir)
        # 3-4. PTQ algorithms (`algo`), quantize, evaluate on the full test set: the reference semantics and
        #      the runtime form on this CPU; its tables and charts; the quantizer's own error per layer.
        made = quantize_stage(plan, fp32, inputs, shared, run_id, output_dir)
        reference = made.result.reference
        evaluation = evaluation_files(
            reference, output_dir / "evaluation", plan.name, fp32.baseline.evaluation
        )
        analyse_layers(plan, made, fp32.baseline, inputs, output_dir)
        # 5. The device (`device`): the saved model's integer form run as the device computes, every image.
        device_result = on_device(
            plan.device, plan.backend, made.quantized.path, inputs, reference.predictions, plan.name,
            made.adc_profiles,
        )  # fmt: skip
        # 6. The microcontroller (`mcu`; TFLite models): every test image in TFLite Micro against the
        #    reference kernels, the tensor arena and flash, the boards it fits, Vela's NPU estimate.
        mcu_result = on_mcu(cfg, plan.mcu, plan.backend, made.quantized.path, inputs, reference, plan.name)
        # 7. Log.
        model = model_record(
            cfg, plan.backend, made.quantized.path, inputs.test_images, inputs.datasets.quantized
        )
        records.log_quantized(fp32.record, run_id, plan.name, cfg, made, evaluation, model)
        if device_result is not None:
            records.log_device(fp32.record, run_id, device_result, reference.predictions)
        if mcu_result is not None:
            records.log_mcu(run_id, mcu_result, output_dir)
    return run_id


@dataclass(frozen=True)
class Fp32:
    """The FP32 step's result: the canonical model, its baseline in the run's backend, and what the run's
    records share (:class:`RunContext`)."""

    canonical: CanonicalModel
    baseline: Baseline
    record: RunContext


def fp32_stage(plan: Plan, inputs: RunInputs, shared: Shared, run_id: str, output_dir: Path) -> Fp32:
    """The canonical ONNX model (the .h5 for a backend that converts Keras itself) in the run's backend, its
    accuracy the baseline (its run logged once per sweep); the run's context tags (data, model, versions,
    hardware); the quantized models published for the backend's format, evaluated and logged once per
    sweep."""
    cfg, backend = plan.cfg, plan.backend
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
    fp32_record = model_record(cfg, backend, baseline.model.path, inputs.test_images, inputs.datasets.fp32)
    record = RunContext(
        plan.experiment_id, plan.params, plan.tags | context, baseline, inputs.perf_subset, output_dir
    )
    records.log_baseline_once(record, backend.NAME, fp32_record)
    log_published_once(cfg, record, backend, inputs, plan.mcu, plan.device)
    return Fp32(canonical, baseline, record)


def quantize_stage(
    plan: Plan, fp32: Fp32, inputs: RunInputs, shared: Shared, run_id: str, output_dir: Path
) -> Quantization:
    """The quantization and its evaluation (:func:`quantize_and_evaluate`); the device runs of one
    quantization (a sweep over `device.*`) make it once, in the first of them, then reuse it (``shared``)."""
    made = shared.quantized.get(plan.quantization_key) if plan.device.enabled else None
    if made is None:
        made = quantize_and_evaluate(plan, fp32.canonical, inputs, output_dir)
        if plan.device.enabled:
            shared.quantized.put(plan.quantization_key, made)
    else:
        set_tags(run_id, {"device.quantization_run": made.run_name})
        log.info("%s: reusing the quantized model of %s", plan.name, made.run_name)
    result = made.result
    log.info(
        "%s: accuracy %.4f (FP32 %.4f); %s: %s", plan.name, result.reference.accuracy,
        fp32.baseline.evaluation.accuracy, result.verdict.execution, result.verdict.reason,
    )  # fmt: skip
    return made


def analyse_layers(
    plan: Plan, made: Quantization, baseline: Baseline, inputs: RunInputs, output_dir: Path
) -> None:
    """The quantizer's own error per layer (``layer_analysis``): the quantized model against the FP32 model
    it was given (after the algorithms) on :data:`LAYER_ERROR_IMAGES` calibration images, timed; once per
    quantization (kept on ``made``)."""
    if made.layer_errors is not None:
        return
    made.layer_errors = []
    if not plan.cfg.layer_analysis:
        return
    start = time.perf_counter()
    given = (
        baseline.model
        if not plan.algo.steps
        else plan.backend.load_fp32(made.prepared.onnx_path, output_dir / "algo")
    )
    images = inputs.calibration_images[:LAYER_ERROR_IMAGES]
    made.layer_errors = plan.backend.layer_errors(given, made.quantized, images)
    made.quantized.metrics["layer_analysis_seconds"] = time.perf_counter() - start


def quantize_and_evaluate(
    plan: Plan, canonical: CanonicalModel, inputs: RunInputs, output_dir: Path
) -> Quantization:
    """The PTQ algorithms on the FP32 model (`algo`), the quantization, the check of its layers (raised,
    first and last), and the evaluation of both forms on the full test set."""
    cfg, backend, spec = plan.cfg, plan.backend, plan.spec
    calibration = inputs.calibration_images
    prepared = prepare(
        plan.algo,
        canonical.onnx_path,
        calibration,
        spec,
        output_dir / "algo",
        cfg.data.seed,
        Path(cfg.cache_dir),
    )
    source = source_path(backend, canonical, prepared.onnx_path)
    quantized = backend.quantize(source, calibration, prepared.learned(spec), output_dir / "model")
    graph = onnx.load(prepared.onnx_path)
    shared = check_layers(quantized, spec, graph)
    first_last = check_first_last(quantized.layers, graph, spec)
    own = check_own_widths(quantized.layers, graph, spec)
    quantized.metrics |= configured_cost(graph, spec).metrics()  # the widths the checks above confirmed
    tolerance = cfg.native_tolerance_points
    result = evaluate_quantized(quantized, inputs.test_images, inputs.test_labels, plan.name, tolerance)
    tags = {"dtype.first_last": first_last} if first_last else {}
    tags |= {"layer_bits": own} if own else {}
    return Quantization(plan.name, prepared, quantized, shared, result, tags=tags)


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
    result = evaluate_device(integer, device, inputs, reference_predictions, name, adc_profiles)
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
        path, mcu, inputs, reference.probabilities, Path(cfg.cache_dir), threads_per_run(cfg),
        f"{name}: TFLite Micro",
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


def fp32_baseline(
    shared: Shared, backend: Backend, onnx_path: Path, cache_dir: Path, data: Cifar10
) -> Baseline:
    """The backend's FP32 model evaluated on the test set, once per ``shared``, backend instance (see
    make_backend), model file and dataset."""

    def evaluate() -> Baseline:
        model = backend.load_fp32(onnx_path, cache_dir / backend.NAME)
        return evaluate_baseline(model, *test_set(shared, data), f"{backend.NAME}-fp32")

    return shared.get("baseline", (backend, onnx_path, cache_dir, data), evaluate)
