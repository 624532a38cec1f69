"""MLPerf Tiny's keyword spotting (DS-CNN, from its float .tflite) and visual wake words (MobileNetV1, from
its Keras 2 .h5) models through the toolchains and the integer device, with a user's arrays (data=npz) as a
user runs them: structure only (generated inputs and labels; their data sets are not on these machines), so
what is checked is what runs, what is logged and that the integer device agrees, not accuracy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from ai_edge_litert.interpreter import Interpreter
from mlflow.tracking import MlflowClient

from resnet8ptq.datasets import generate
from resnet8ptq.model import canonical_onnx, resolve_source

KWS_CLASSES = {"down", "go", "left", "no", "off", "on", "right", "stop", "up", "yes", "silence", "unknown"}
MLPERF = "models/mlperf_tiny"
KWS_TFLITE = f"{MLPERF}/keyword_spotting/kws_ref_model_float32.tflite"
KWS_SHA256 = "e5004c6f1012246e33fa068d8488325538e0444073cd361f5a7edb40c73f12d2"
VWW_H5 = f"{MLPERF}/visual_wake_words/vww_96.h5"
VWW_SHA256 = "af9111d50e6e85b2f2123345e0316ef1c384865ebf6b06340ddac7e66017450f"


def sweep(run_cli, workdir: Path, store: Path, *args: str) -> MlflowClient:
    """Run ``python run.py ARGS`` in ``workdir`` on a copy of the initialised ``store``; it must succeed."""
    shutil.copy(store, workdir / "mlflow.db")
    result = run_cli(workdir, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")


def runs(client: MlflowClient, quantized: str) -> list:
    experiment = client.get_experiment_by_name("resnet8ptq")
    return client.search_runs([experiment.experiment_id], f"tags.quantized = '{quantized}'")


def test_keyword_spotting_through_onnx_and_torch_on_the_integer_device(
    run_cli, initialised_store: Path, tmp_path: Path
) -> None:
    data = generate(tmp_path / "kws.npz", (49, 10, 1), 12, test=64, calibration=16, seed=1)
    client = sweep(
        run_cli, tmp_path, initialised_store,
        "-m", "model=kws", "backend=onnx,torch", "dtype=int8", "per_channel=true", "device=integer",
        "data=npz", f"data.path={data}", "report.enabled=false", "layer_analysis=false",
    )  # fmt: skip
    quantized = runs(client, "true")
    assert sorted(run.info.run_name for run in quantized) == [
        "kws-onnx-int8-int8-minmax-pc-int",
        "kws-torch-int8-int8-minmax-pc-int",
    ]
    for run in quantized:
        tags, metrics = run.data.tags, run.data.metrics
        assert run.info.status == "FINISHED"
        assert tags["model"] == "kws" and tags["data"] == "npz"
        assert tags["data.verified"].startswith("sha256 ")
        # The integer device against the float reference: 0 on an AMD EPYC Zen 3; a near tie may flip where
        # another CPU's float kernels round otherwise.
        assert metrics["device_differing_predictions"] <= 2
        classes = {name.removeprefix("class_acc/") for name in metrics if name.startswith("class_acc/")}
        assert classes and classes <= KWS_CLASSES  # named as MLPerf's labels (those with test samples)
        assert "accuracy_perf_subset" not in metrics  # MLPerf's subset is CIFAR-10's: none here
    assert sorted(run.info.run_name for run in runs(client, "false")) == ["kws-onnx-fp32", "kws-torch-fp32"]


def test_visual_wake_words_through_tflite_and_its_microcontroller_path(
    run_cli, initialised_store: Path, tmp_path: Path
) -> None:
    """The Keras 2 .h5 (read with the DepthwiseConv2D fix-up) converted by TFLite's own converter, run in
    TFLite Micro and on the integer device."""
    data = generate(tmp_path / "vww.npz", (96, 96, 3), 2, test=32, calibration=16, seed=2)
    client = sweep(
        run_cli, tmp_path, initialised_store,
        "model=vww", "backend=tflite", "dtype=int8", "per_channel=true", "device=integer",
        "data=npz", f"data.path={data}", "report.enabled=false", "mcu/boards=[pico]",
    )  # fmt: skip
    (run,) = runs(client, "true")
    metrics = run.data.metrics
    assert run.info.status == "FINISHED" and run.info.run_name == "vww-tflite-int8-int8-minmax-pc-int"
    assert metrics["device_differing_predictions"] == 0 and metrics["mcu_differing_outputs"] == 0
    assert {"class_acc/no_person", "class_acc/person"} <= set(metrics)


@pytest.fixture(scope="module")
def converted(assets_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The canonical ONNX models of VWW and KWS, converted in a cache of their own."""
    cache = tmp_path_factory.mktemp("networks")

    def convert(relative: str, sha256: str, name: str) -> Path:
        source, actual = resolve_source(assets_dir / relative, sha256, cache)
        return canonical_onnx(source, actual, cache, name).onnx_path

    return convert


def litert(model: Path, inputs: np.ndarray) -> np.ndarray:
    interpreter = Interpreter(str(model))
    interpreter.allocate_tensors()
    given, output = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    outputs = []
    for sample in inputs:
        interpreter.set_tensor(given["index"], sample[None])
        interpreter.invoke()
        outputs.append(interpreter.get_tensor(output["index"])[0])
    return np.array(outputs)


def test_the_converted_networks_compute_what_mlperfs_float_models_do(converted, assets_dir: Path) -> None:
    """VWW's .h5 (Keras 3, fix-up) against MLPerf's own float .tflite of it: the same outputs to float
    rounding. KWS's .tflite holds five convolutions' weights in int8, which LiteRT runs in hybrid kernels
    (activations quantized on the fly) and the converted model in float with the weights dequantized: the
    same classes, outputs within a few hundredths."""
    rng = np.random.default_rng(0)
    images = rng.random((16, 96, 96, 3), dtype=np.float32)
    vww = ort.InferenceSession(converted(VWW_H5, VWW_SHA256, "vww")).run(None, {"input": images})[0]
    reference = litert(assets_dir / MLPERF / "visual_wake_words/vww_96_float.tflite", images)
    np.testing.assert_allclose(vww, reference, atol=1e-5)
    features = rng.uniform(-25, 25, (64, 49, 10, 1)).astype(np.float32)
    kws = ort.InferenceSession(converted(KWS_TFLITE, KWS_SHA256, "kws")).run(None, {"input": features})[0]
    reference = litert(assets_dir / KWS_TFLITE, features)
    assert np.mean(kws.argmax(1) == reference.argmax(1)) >= 0.95
    assert np.abs(kws - reference).max() < 0.1
