"""ONNX Runtime backend: ORT calibrators (fed float64 activations: :mod:`.float64`) + ``quantize_static``
(QDQ), run by the CPU execution provider.

The reference form is the QDQ model with graph optimisations off (its exact quantize/dequantize semantics);
the runtime form is the same file with all optimisations on, where ORT fuses QDQ pairs into integer kernels
(:func:`kernel_summary` reads which from the optimised graph ORT saves).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationMethod, QuantFormat, create_calibrator, quantize_static
from onnxruntime.quantization.calibrate import TensorData, TensorsData, save_tensors_data
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from resnet8ptq.backends.base import Backend, MlflowFlavor, Model, QuantizedModel, Runtime
from resnet8ptq.backends.onnx import calibration_cache
from resnet8ptq.backends.onnx.float64 import use_float64
from resnet8ptq.backends.onnx.layer_errors import QdqPairs
from resnet8ptq.backends.onnx.options import cpu_options
from resnet8ptq.backends.onnx.reader import ImageReader, input_name
from resnet8ptq.backends.onnx.widths import (
    QUANT_TYPES,
    activation_qranges,
    activation_widths,
    clamp_narrow_activations,
    clip_weights,
    layer_precision,
    tensor_overrides,
)
from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.entropy_threshold import use_fast_search
from resnet8ptq.model import save_onnx
from resnet8ptq.spec import QuantSpec, TensorRange

NO_NATIVE = "native execution disabled (backend.native=false): the reference semantics only"


OP_TYPES = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


INTEGER_WEIGHTED_OPS = {"QLinearConv", "QGemm", "QLinearMatMul", "ConvInteger", "MatMulInteger"}


FLOAT_WEIGHTED_OPS = {"Conv", "Gemm", "MatMul", "FusedConv", "FusedGemm", "FusedMatMul"}


def session(
    path: Path, threads: int | None = None, optimize: bool = True, optimized_path: Path | None = None
) -> ort.InferenceSession:
    """A CPU inference session for the model at ``path`` (:func:`cpu_options`: ``threads`` intra-op threads,
    None: the cores this process may use).

    ``optimize=False`` turns graph optimisations off: a QDQ model then runs its exact quantize/dequantize
    semantics (float ops between QuantizeLinear/DequantizeLinear). ``optimized_path``: where ORT saves the
    graph it runs after optimisation (which ops were fused into integer kernels).
    """
    options = cpu_options(threads, optimize)
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
        options.log_severity_level = 3  # ORT warns that an NCHWc-optimised graph is hardware-specific
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def predictor(sess: ort.InferenceSession):
    """Wrap a session as a Predictor (images -> probabilities)."""
    input_name = sess.get_inputs()[0].name

    def predict(images: np.ndarray) -> np.ndarray:
        return sess.run(None, {input_name: np.ascontiguousarray(images, dtype=np.float32)})[0]

    return predict


def kernel_summary(optimized: onnx.ModelProto) -> tuple[bool, str]:
    """Whether the optimised graph runs its conv/gemm layers in integer kernels, and which ops it runs."""
    counts = Counter(node.op_type for node in optimized.graph.node)
    integer = {op: n for op, n in sorted(counts.items()) if op in INTEGER_WEIGHTED_OPS}
    in_float = {op: n for op, n in sorted(counts.items()) if op in FLOAT_WEIGHTED_OPS}
    layers = sum(integer.values()) + sum(in_float.values())
    listed = ", ".join(f"{op} x{n}" for op, n in integer.items())
    if not integer:
        return False, (
            f"ONNX Runtime's optimised graph keeps all {layers} conv/gemm layers in float between "
            f"DequantizeLinear and QuantizeLinear (no integer kernel for this model)"
        )
    floats = ", ".join(f"{op} x{n}" for op, n in in_float.items())
    rest = f"; in float: {floats}" if floats else ""
    share = f"{sum(integer.values())}/{layers}"
    return True, f"ONNX Runtime runs {share} conv/gemm layers in integer kernels ({listed}{rest})"


def mse_ranges(histograms: dict[str, tuple], fp32: onnx.ModelProto, spec: QuantSpec) -> TensorsData:
    """``calib=mse``: each tensor's :func:`~resnet8ptq.calibration.mse_range` over the histogram ORT's
    calibrator collected, for the integer range the tensor is stored in (:func:`activation_qranges`); given
    to ``quantize_static`` as MinMax data (ranges it takes as they are)."""
    from resnet8ptq.calibration import mse_range

    qranges = activation_qranges(fp32, spec, histograms)
    data = {}
    for name, histogram in histograms.items():
        low, high = mse_range(histogram, qranges[name], spec.calib.symmetric)
        data[name] = TensorData(lowest=np.float32(low), highest=np.float32(high))
    return TensorsData(CalibrationMethod.MinMax, data)


def with_learned_ranges(tensors_range: TensorsData, spec: QuantSpec) -> TensorsData:
    """The calibrated ranges with those an `algo` step learned (:attr:`QuantSpec.learned_ranges`) in their
    place; each learned tensor must be one ORT calibrated."""
    if not spec.learned_ranges:
        return tensors_range
    data = dict(tensors_range.data)
    unknown = [learned.tensor for learned in spec.learned_ranges if learned.tensor not in data]
    if unknown:
        raise RuntimeError(
            f"Learned activation ranges for tensors ONNX Runtime does not calibrate: {unknown}"
        )
    for learned in spec.learned_ranges:
        data[learned.tensor] = TensorData(lowest=np.float32(learned.min), highest=np.float32(learned.max))
    return TensorsData(tensors_range.calibration_method, data)


class OnnxRuntimeBackend(Backend):
    """Quantizes the canonical ONNX model with ``onnxruntime.quantization.quantize_static``."""

    NAME = "onnx"

    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        return Model(
            predict=predictor(session(onnx_path, self.threads)), path=onnx_path, source_path=onnx_path
        )

    def quantize(
        self, onnx_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        workdir.mkdir(parents=True, exist_ok=True)
        ranges_path = workdir / "calibration_ranges.json"
        # ORT writes <model>-inferred.onnx beside its input and deletes it: parallel jobs sharing the cached
        # model would delete each other's file, so each run quantizes its own copy.
        onnx_path = Path(shutil.copy(onnx_path, workdir / "model_fp32.onnx"))
        model_input = input_name(onnx_path)
        fp32 = onnx.load(onnx_path)

        def calibrate() -> TensorsData:
            calibrator = create_calibrator(
                onnx_path,
                OP_TYPES,
                augmented_model_path=str(workdir / "augmented_model.onnx"),
                calibrate_method=spec.calib.ort_method(),
                extra_options=spec.calib.ort_options(),
            )
            use_float64(calibrator, self.threads)
            use_fast_search(calibrator)
            with contextlib.redirect_stdout(io.StringIO()):  # ORT's histogram calibrators print progress
                calibrator.collect_data(ImageReader(calibration_images, spec.calib.batch_size, model_input))
                if spec.calib.method == "mse":
                    computed = mse_ranges(calibrator.collector.histogram_dict, fp32, spec)
                else:
                    computed = calibrator.compute_data()
            del calibrator
            (workdir / "augmented_model.onnx").unlink(missing_ok=True)
            return computed

        entry_key = calibration_cache.key(onnx_path, calibration_images, spec, OP_TYPES, self.threads)
        calibration = calibration_cache.calibrated(self.cache_dir, entry_key, calibrate)
        tensors_range = with_learned_ranges(calibration.ranges, spec)
        save_tensors_data(tensors_range, ranges_path)
        ranges = {
            name: (float(np.min(data.range_value[0])), float(np.max(data.range_value[1])))
            for name, data in sorted(tensors_range.data.items())
        }

        start = time.perf_counter()
        widths = activation_widths(fp32, spec, ranges)
        out = workdir / "model_quantized.onnx"
        quantize_static(
            onnx_path,
            out,
            calibration_data_reader=None,
            calibration_cache_path=ranges_path,
            calibrate_method=tensors_range.calibration_method,
            quant_format=QuantFormat.QDQ,
            activation_type=QUANT_TYPES[spec.dtype.storage[0]],
            weight_type=QUANT_TYPES[spec.dtype.weight],
            per_channel=spec.per_channel,
            reduce_range=spec.reduce_range,
            op_types_to_quantize=OP_TYPES,
            extra_options={"TensorQuantOverrides": tensor_overrides(fp32, spec, ranges, widths)},
        )
        quantized = onnx.load(out)
        clamp_narrow_activations(quantized, spec, widths)
        clip_weights(quantized, fp32, spec)
        save_onnx(quantized, out)
        quantize_seconds = time.perf_counter() - start

        layers = layer_precision(quantized)
        reference = predictor(session(out, self.threads, optimize=False))
        return QuantizedModel(
            path=out,
            reference=reference,
            runtime=self._runtime(out, workdir) if self.native else Runtime(reference, False, NO_NATIVE),
            ranges=[TensorRange(name, *bounds) for name, bounds in ranges.items()],
            layers=layers,
            calib_seconds=calibration.seconds,
            quantize_seconds=quantize_seconds,
            tags={calibration_cache.REUSED_TAG: str(calibration.reused).lower()},
        )

    def _runtime(self, path: Path, workdir: Path) -> Runtime:
        """The model as ORT deploys it (all graph optimisations) and the kernels its optimised graph runs."""
        optimized = workdir / "runtime_optimized.onnx"
        sess = session(path, self.threads, optimize=True, optimized_path=optimized)
        integer_kernels, kernels = kernel_summary(onnx.load(optimized))
        optimized.unlink()
        return Runtime(predictor(sess), integer_kernels, kernels)

    def integer_model(self, path: Path) -> IntegerModel:
        from resnet8ptq.backends.onnx.integer import integer_model

        return integer_model(path)

    def tensor_pairs(self, fp32: Model, quantized: QuantizedModel) -> QdqPairs:
        """Paired by ORT's ``qdq_loss_debug`` (:class:`.layer_errors.QdqPairs`)."""
        return QdqPairs(fp32.source_path, quantized.path)

    def mlflow_flavor(self, path: Path) -> MlflowFlavor:
        """The ``mlflow.onnx`` flavor; its pyfunc runs ONNX Runtime's CPU provider with all graph
        optimisations, that is the runtime form (fused integer kernels where ORT has them)."""
        import mlflow.onnx

        versions = self.versions()
        return MlflowFlavor(
            mlflow.onnx,
            {
                "onnx_model": onnx.load(path),
                "onnx_execution_providers": ["CPUExecutionProvider"],
                "save_as_external_data": False,  # one file; the model is a few hundred KiB
            },
            [f"{name}=={versions[name]}" for name in ("onnxruntime", "onnx")],
        )

    @classmethod
    def versions(cls) -> dict[str, str]:
        """onnxruntime, onnx and tf2onnx versions."""
        return {name: importlib.metadata.version(name) for name in ("onnxruntime", "onnx", "tf2onnx")}
