"""The microcontroller path (`mcu`) of the shared three-toolchain sweep: the TFLite run and MLPerf Tiny's own
model in TensorFlow Lite Micro on the first `mcu.images` test images, compared with LiteRT's reference kernels
on the same images; the arena
(the allocator's report against the smallest arena that runs), flash, the board fits and Vela's estimate;
none of it for ONNX Runtime and PyTorch runs; TFLM's outputs read back from the cache by the model's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Run
from tflite_micro import runtime

from resnet8ptq.backends.tflite.flatbuffer import read
from resnet8ptq.backends.tflite.litert_runner import quantize
from resnet8ptq.data import Cifar10, to_model_input
from resnet8ptq.device.fixed_point import ROUNDINGS, quantize_multiplier
from resnet8ptq.mcu import tflm
from resnet8ptq.mcu.evaluate import cached_outputs
from tests.integration.conftest import MCU_IMAGES, Sweeps

DIFFERING_PREDICTIONS = 10  # of MCU_IMAGES: TFLM's kernels may round some ops differently (docs/mcu.md)
BOARDS = ("nucleo_l4r5zi", "nano33_ble_sense", "pico", "samd21")


def mcu_runs(sweeps: Sweeps) -> dict[str, Run]:
    """The sweep's TFLite model runs by name: the configuration (``tflite``) and MLPerf's (``mlperf``)."""
    runs = [
        r
        for r in sweeps.children
        if r.data.tags["backend"] == "tflite" and r.data.tags["quantized"] == "true"
    ]
    return {r.data.tags.get("reference") or "tflite": r for r in runs}


def artifacts(sweeps: Sweeps, run: Run, path: str, tmp_path: Path) -> Path:
    return Path(sweeps.client.download_artifacts(run.info.run_id, path, str(tmp_path / run.info.run_id)))


def test_every_tflite_model_is_measured_on_the_mcu_path_and_only_those(
    sweeps: Sweeps, tmp_path: Path
) -> None:
    runs = mcu_runs(sweeps)
    assert set(runs) == {"tflite", "mlperf"}
    for name, run in runs.items():
        metrics, tags = run.data.metrics, run.data.tags
        # Flash: the flatbuffer the run logged, byte for byte.
        (model,) = artifacts(sweeps, run, "model", tmp_path).glob("*.tflite")
        assert metrics["mcu_flash_bytes"] == model.stat().st_size
        # Arena: the recording allocator and the bisection agree; the planned tensors' peak fits its head.
        assert abs(metrics["mcu_arena_bytes"] - metrics["mcu_arena_smallest_bytes"]) <= 512, name
        assert (
            metrics["mcu_tensors_peak_bytes"] <= metrics["mcu_arena_head_bytes"] < metrics["mcu_arena_bytes"]
        )
        report = (artifacts(sweeps, run, "mcu", tmp_path) / "arena_report.txt").read_text()
        assert f"Arena allocation total {int(metrics['mcu_arena_bytes'])} bytes" in report
        # Boards: ResNet8's int8 arena (~56 KiB) fits every listed board but the 32 KiB SAMD21.
        assert tags["mcu.fits"] == "nucleo_l4r5zi,nano33_ble_sense,pico", name
        assert tags["mcu.board.samd21"].startswith("no: RAM ")
        assert {key.removeprefix("mcu.board.") for key in tags if key.startswith("mcu.board.")} == set(BOARDS)
        assert "CONV_2D x9" in tags["mcu.kernels"] and "FULLY_CONNECTED x1" in tags["mcu.kernels"]
        # The NPU estimate: every op on the Ethos-U55, at Vela's default 500 MHz.
        assert metrics["npu_cpu_ops"] == 0 and metrics["npu_cycles"] > 0
        assert metrics["npu_inference_ms"] == pytest.approx(1e3 * metrics["npu_cycles"] / 500e6)
        assert tags["npu.accelerator"] == "Ethos_U55_128"
    for run in sweeps.children:
        if run.data.tags["backend"] != "tflite":
            assert not [key for key in run.data.metrics if key.startswith(("mcu_", "npu_", "accuracy_mcu"))]


def test_tflm_predictions_are_the_reference_kernels(
    sweeps: Sweeps, cifar: Cifar10, assets_dir: Path, tmp_path: Path
) -> None:
    """mcu/predictions.csv of each TFLite model: the first `mcu.images` test images, its reference column
    LiteRT's reference kernels (the device run's, which equal them: test_device.py), TFLM's predictions differ
    on at most a few images, and the metrics count them and score both on those images; 30 images rerun
    through tflite_micro directly agree with the tflm column."""
    images = to_model_input(cifar.test_images)
    for name, run in mcu_runs(sweeps).items():
        metrics, tags = run.data.metrics, run.data.tags
        table = pd.read_csv(artifacts(sweeps, run, "mcu", tmp_path) / "predictions.csv")
        assert len(table) == metrics["mcu_images"] == MCU_IMAGES
        assert (table["label"] == np.asarray(cifar.test_labels)[:MCU_IMAGES]).all()
        differing = int((table["tflm"] != table["reference"]).sum())
        assert differing == metrics["mcu_differing_predictions"] <= DIFFERING_PREDICTIONS, name
        assert metrics["accuracy_mcu"] == float((table["tflm"] == table["label"]).mean())
        assert metrics["accuracy_mcu_reference"] == float((table["reference"] == table["label"]).mean())
        assert "accuracy_mcu_perf_subset" not in metrics  # MLPerf's 200 are spread over all 10,000
        if metrics["mcu_differing_outputs"]:
            assert tags["mcu.divergence"].startswith("first differs at op ")
        which = (
            "identical"
            if metrics["mcu_differing_outputs"] == 0
            else f"{int(metrics['mcu_differing_outputs'])} of"
        )
        assert tags["mcu.vs_reference"].startswith(which), tags["mcu.vs_reference"]
        assert tags["mcu.vs_reference"].endswith(f"(the first {MCU_IMAGES} of 10000 test images)")
        (model,) = artifacts(sweeps, run, "model", tmp_path).glob("*.tflite")
        interpreter = runtime.Interpreter.from_bytes(model.read_bytes())
        source = interpreter.get_input_details(0)
        scale = source["quantization_parameters"]["scales"][0]
        zero_point = source["quantization_parameters"]["zero_points"][0]
        for index in range(30):
            interpreter.set_input(quantize(images[index : index + 1], scale, zero_point, np.int8), 0)
            interpreter.invoke()
            assert int(np.argmax(interpreter.get_output(0))) == table["tflm"][index]
    device = [r for r in sweeps.children if r.data.tags.get("device.kind") and "reference" not in r.data.tags]
    (tflite_device,) = [r for r in device if r.data.tags["backend"] == "tflite"]
    reference = pd.read_csv(artifacts(sweeps, tflite_device, "device", tmp_path) / "predictions.csv")
    mcu = pd.read_csv(artifacts(sweeps, mcu_runs(sweeps)["tflite"], "mcu", tmp_path) / "predictions.csv")
    assert (mcu["reference"] == reference["reference"][:MCU_IMAGES]).all()


def test_tflm_outputs_are_cached_by_the_models_bytes(
    sweeps: Sweeps, cifar: Cifar10, assets_dir: Path, model_cache: Path, tmp_path: Path, monkeypatch
) -> None:
    """The sweep left TFLM's outputs of MLPerf's model in its cache directory: the same bytes on the same
    inputs are read back (TFLM does not run again) and give the run's logged TFLM predictions."""
    model = (assets_dir / "models" / "pretrainedResnet_quant.tflite").read_bytes()
    source, _ = tflm.io(model)
    images = to_model_input(cifar.test_images[:MCU_IMAGES])
    inputs = quantize(images, source.scale, source.zero_point, source.dtype)
    monkeypatch.setattr(tflm, "run", lambda *args, **kwargs: pytest.fail("TFLM ran again"))
    outputs = cached_outputs(model, inputs, model_cache, 1, "mlperf")
    table = pd.read_csv(artifacts(sweeps, mcu_runs(sweeps)["mlperf"], "mcu", tmp_path) / "predictions.csv")
    assert (outputs.argmax(axis=1) == table["tflm"].to_numpy()).all()


def test_tflm_fully_connected_rounds_twice_where_litert_reference_rounds_once(
    cifar: Cifar10, assets_dir: Path
) -> None:
    """Why TFLM and LiteRT's reference kernels can part (docs/mcu.md): TFLM's FULLY_CONNECTED requantizes with
    gemmlowp's double rounding, which LiteRT's reference kernel here does not (it rounds once, see
    docs/device.md). Recomputed from TFLM's own FC input on 100 images of MLPerf's model, the double rounding
    gives TFLM's output on every image."""
    path = assets_dir / "models" / "pretrainedResnet_quant.tflite"
    model = read(path)
    ((_, inputs, outputs),) = [op for op in model.ops if op[0] == "FULLY_CONNECTED"]
    source, weight, bias = (model.tensors[i] for i in inputs)
    target = model.tensors[outputs[0]]
    multiplier, shift = quantize_multiplier(
        float(source.scales[0]) * float(weight.scales[0]) / float(target.scales[0])
    )
    interpreter = runtime.Interpreter.from_bytes(
        path.read_bytes(), intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors
    )
    images = to_model_input(cifar.test_images[:100])
    same = {name: 0 for name in ROUNDINGS}
    for index in range(len(images)):
        interpreter.set_input(quantize(images[index : index + 1], 1.0, -128, np.int8), 0)
        interpreter.invoke()
        x = interpreter.GetTensor(inputs[0], 0)["tensor_data"].reshape(1, -1).astype(np.int64)
        expected = interpreter.GetTensor(outputs[0], 0)["tensor_data"].reshape(-1)
        w = weight.values.astype(np.int64) - int(weight.zero_points[0])
        acc = ((x - int(source.zero_points[0])) @ w.T + bias.values.astype(np.int64)).reshape(-1)
        for name, requantize in ROUNDINGS.items():
            y = np.asarray(requantize(acc, multiplier[0], shift[0])) + int(target.zero_points[0])
            same[name] += np.array_equal(np.clip(y, -128, 127), expected)
    assert same["double"] == len(images)
    assert same["single"] < len(images)  # the images where the two roundings part (254 of 300 agreed here)
