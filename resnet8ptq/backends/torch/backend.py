"""PyTorch backend: onnx2torch FP32 model, torchao PT2E static quantization, torch.export ``.pt2`` files.

Flow: ONNX → onnx2torch GraphModule (:mod:`.convert`) → torch.export → ``prepare_pt2e`` with
X86InductorQuantizer and ORT-equivalent observers (:mod:`.quantizer`, :mod:`.observers`) → calibration →
``convert_pt2e`` → torch.export → ``torch.export.save`` (:mod:`.program` reads the result back).

The reference form is the converted program run eagerly (float quantize/dequantize: the exact quantized
numerics). The runtime form, for uint8 activations with int8 weights (the only pair x86 int8 kernels take),
is the program compiled by inductor into oneDNN int8 kernels (:mod:`.native`); the pipeline checks it against
the reference on the test set (:mod:`resnet8ptq.execution`).
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from pathlib import Path

import numpy as np
import torch

from resnet8ptq.backends.base import Backend, MlflowFlavor, Model, Predictor, QuantizedModel, Runtime
from resnet8ptq.backends.torch.compiled import CompileFailed, compile_native, compile_simulated
from resnet8ptq.backends.torch.convert import (
    example_input,
    export,
    input_shape,
    make_predictor,
    onnx_to_torch,
    save_program,
)
from resnet8ptq.backends.torch.layer_errors import ProgramPairs, program_pairs
from resnet8ptq.backends.torch.observers import split_shared_observers
from resnet8ptq.backends.torch.program import (
    check_quantized,
    drop_unused_attributes,
    fold_weight_dequantize,
    layer_precision,
    payload_bytes,
    weight_granularity,
)
from resnet8ptq.backends.torch.quantizer import (
    activation_observers,
    calibrate,
    compute_ranges,
    fix_learned_ranges,
    make_quantizer,
)
from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.spec import QuantSpec, base_precision

log = logging.getLogger(__name__)


class TorchBackend(Backend):
    """onnx2torch + torchao PT2E (X86InductorQuantizer, ORT-equivalent observers), torch.export files.

    ``native=True`` (default) compiles uint8-activation/int8-weight models into inductor's x86 int8
    kernels as their runtime form; ``native=False`` runs only the reference (eager quantize/dequantize)
    program and skips the compile.
    """

    NAME = "torch"

    def __init__(self, native: bool = True, threads: int | None = None) -> None:
        super().__init__(native, threads)
        torch.set_num_threads(self.threads)

    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        """onnx2torch conversion, exported and saved as ``model_fp32.pt2``."""
        path = Path(workdir) / "model_fp32.pt2"
        program = save_program(export(onnx_to_torch(onnx_path), example_input(input_shape(onnx_path))), path)
        return Model(predict=make_predictor(program.module()), path=path, source_path=onnx_path)

    def quantize(
        self, onnx_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        """PT2E static quantization of a fresh conversion of ``onnx_path`` (prepare_pt2e rewrites the graph it
        is given); saves ``model_quantized.pt2``; compiles the runtime form where x86 int8 kernels exist."""
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        start = time.perf_counter()
        shape = input_shape(onnx_path)
        example = example_input(shape)
        quantizer = make_quantizer(spec, onnx_path)
        prepared = prepare_pt2e(export(onnx_to_torch(onnx_path), example).module(), quantizer)
        split_shared_observers(prepared)
        observers = activation_observers(prepared, onnx_path)
        calib_start = time.perf_counter()
        calibrate(prepared, calibration_images, spec.calib)
        fix_learned_ranges(observers, spec)
        ranges = compute_ranges(observers)
        calib_seconds = time.perf_counter() - calib_start
        converted = convert_pt2e(prepared)
        drop_unused_attributes(converted)
        path = Path(workdir) / "model_quantized.pt2"
        exported = export(converted, example)
        layer_nodes = quantizer.layer_nodes(exported.graph)  # before saving drops the module metadata
        program = save_program(exported, path)
        counts = check_quantized(program)
        layers = layer_precision(program, layer_nodes)
        quantize_seconds = time.perf_counter() - start - calib_seconds  # as in ORT: calibration apart

        reference_module = program.module()
        fold_weight_dequantize(reference_module)  # the same numbers, computed once (program.py)
        reference = make_predictor(reference_module)
        dtypes = (base_precision(layers, "activation")[0], base_precision(layers, "weight")[0])
        runtime, compile_seconds = self._runtime(program, reference_module, shape, dtypes, reference)
        log.info("torch %s/%s runtime: %s", *dtypes, runtime.kernels)
        return QuantizedModel(
            path=path,
            reference=reference,
            runtime=runtime,
            ranges=ranges,
            layers=layers,
            calib_seconds=calib_seconds,
            quantize_seconds=quantize_seconds,
            metrics={
                "compile_seconds": compile_seconds,
                **{f"{op}_ops": float(n) for op, n in counts.items()},
                "weights_bytes": float(payload_bytes(program)),
            },
            tags={
                "weight_granularity": weight_granularity(program),
                "quantizer": "torchao.pt2e.X86InductorQuantizer+ORT-observers",
            },
        )

    def _runtime(
        self,
        program: torch.export.ExportedProgram,
        folded: torch.fx.GraphModule,
        shape: tuple[int, ...],
        dtypes: tuple[str, str],
        reference: Predictor,
    ) -> tuple[Runtime, float]:
        """How the program runs when deployed, and the compile seconds: inductor's int8 kernels for
        uint8/int8, else (or when inductor does not lower every layer) the folded program compiled into
        float kernels; the reference program itself when compiling fails or native=false."""
        if not self.native:
            return Runtime(reference, False, "native execution disabled (backend.native=false)"), 0.0
        spent = 0.0
        if dtypes == ("uint8", "int8"):
            try:
                compiled, seconds, lowered = compile_native(program.module(), shape)
                return Runtime(compiled, True, f"inductor lowered {lowered} to oneDNN int8 kernels"), seconds
            except CompileFailed as err:
                why, spent = f"no int8 kernels ({err})", err.seconds
        else:
            why = f"x86 int8 kernels (oneDNN) take uint8 activations and int8 weights, not {'/'.join(dtypes)}"
        try:
            compiled, seconds = compile_simulated(folded, shape)
        except CompileFailed as err:
            return Runtime(reference, False, f"{why}; compiling failed ({err}): the q/dq program ran"), spent
        kernels = f"{why}: the q/dq program compiled by inductor into float kernels"
        return Runtime(compiled, False, kernels), spent + seconds

    def integer_model(self, path: Path) -> IntegerModel:
        from resnet8ptq.backends.torch.integer import integer_model

        return integer_model(path)

    def tensor_pairs(self, fp32: Model, quantized: QuantizedModel) -> ProgramPairs:
        """The saved quantized program (its q/dq form, also for native runs) against the saved FP32 program
        (:func:`.layer_errors.program_pairs`)."""
        return program_pairs(fp32.path, quantized.path, fp32.source_path)

    def mlflow_flavor(self, path: Path) -> MlflowFlavor:
        """A pyfunc logged as code (``pyfunc_model.py``) around the ``.pt2``; it needs torch and torchao."""
        import mlflow.pyfunc

        versions = self.versions()
        return MlflowFlavor(
            mlflow.pyfunc,
            {
                "python_model": str(Path(__file__).with_name("pyfunc_model.py")),
                "artifacts": {"program": str(path)},
            },
            [f"{name}=={versions[name]}" for name in ("torch", "torchao")] + [f"numpy=={np.__version__}"],
        )

    @classmethod
    def versions(cls) -> dict[str, str]:
        """torch, torchao, onnx2torch and torchvision versions."""
        return {
            name: importlib.metadata.version(name)
            for name in ("torch", "torchao", "onnx2torch", "torchvision")
        }
