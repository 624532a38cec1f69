"""MLPerf Tiny's keyword spotting (DS-CNN, from its float .tflite), visual wake words (MobileNetV1, from its
Keras 2 .h5) and anomaly detection (a dense autoencoder scored by AUC) models through the toolchains and the
integer device, with a user's arrays (data=npz) as a user runs them: structure only (generated inputs and
labels; their data sets are not on these machines), so what is checked is what runs, what is logged and
that the integer device agrees, not accuracy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pandas as pd
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
AD_H5 = f"{MLPERF}/anomaly_detection/ad01.h5"
AD_SHA256 = "651a62de1b7facd68d1269373992a2d09ffd28e6a816935d4834fcc558bde512"


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


def test_anomaly_detection_scored_by_auc_through_every_toolchain(
    run_cli, initialised_store: Path, tmp_path: Path
) -> None:
    """The autoencoder (its BatchNorms folded into its dense layers) through the three toolchains, the
    integer device and TFLite Micro; each run scored by the AUC of its clips' mean reconstruction errors,
    which the run's logged scores give again in scikit-learn; the report names its quality target."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)  # 12 clips of 4 frames each, scored by their frames' mean error
    groups, clips = np.repeat(np.arange(12), 4), rng.permutation(np.arange(12) % 2)
    data = tmp_path / "ad.npz"
    np.savez(
        data,
        calibration_inputs=rng.random((16, 640), dtype=np.float32),
        test_inputs=rng.random((48, 640), dtype=np.float32),
        test_labels=clips[groups],
        test_groups=groups,
    )
    client = sweep(
        run_cli, tmp_path, initialised_store,
        "-m", "model=ad", "backend=onnx,torch,tflite", "dtype=int8", "per_channel=true", "device=integer",
        "data=npz", f"data.path={data}", "layer_analysis=false", "mcu/boards=[pico]",
    )  # fmt: skip
    quantized = {run.info.run_name: run for run in runs(client, "true")}
    assert sorted(quantized) == [f"ad-{name}-int8-int8-minmax-pc-int" for name in ("onnx", "tflite", "torch")]
    for run in quantized.values():
        tags, metrics = run.data.tags, run.data.metrics
        assert run.info.status == "FINISHED" and tags["metric"] == "auc"
        assert not {"accuracy", "accuracy_device"} & set(metrics)
        assert not any(metric.startswith("class_acc/") for metric in metrics)
        assert metrics["auc_ci_low"] <= metrics["auc"] <= metrics["auc_ci_high"]
        logged = client.download_artifacts(run.info.run_id, "evaluation/predictions.csv", tmp_path)
        scored = pd.read_csv(logged).groupby("group")[["label", "score"]].mean()
        assert metrics["auc"] == pytest.approx(roc_auc_score(scored["label"], scored["score"]), abs=1e-12)
        assert 0 <= metrics["auc_device"] <= 1
    # The integer device is LiteRT's reference kernels exactly; against a float reference a sample's score
    # moves when one of its 640 outputs lands on the other side of a rounding tie.
    assert quantized["ad-tflite-int8-int8-minmax-pc-int"].data.metrics["device_differing_predictions"] == 0
    assert quantized["ad-onnx-int8-int8-minmax-pc-int"].data.metrics["device_differing_predictions"] <= 2
    assert "auc_mcu" in quantized["ad-tflite-int8-int8-minmax-pc-int"].data.metrics
    report = next(tmp_path.rglob("report.md")).read_text()
    assert "| ad | AUC | 0.8500 AUC |" in report


@pytest.fixture(scope="module")
def converted(assets_dir: Path, model_cache: Path):
    """The canonical ONNX models of VWW, KWS and AD, converted in the worker's model cache, where the CLI runs
    of this module convert (and then reuse) them too: each is converted once per worker."""

    def convert(relative: str, sha256: str, name: str) -> Path:
        source, actual = resolve_source(assets_dir / relative, sha256, model_cache)
        return canonical_onnx(source, actual, model_cache, name).onnx_path

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
    """VWW's .h5 (Keras 3, fix-up) against MLPerf's own float .tflite of it, AD's (BatchNorms folded into
    the dense layers) against Keras: the same outputs to float rounding. KWS's .tflite holds five
    convolutions' weights in int8, which LiteRT runs in hybrid kernels (activations quantized on the fly)
    and the converted model in float with the weights dequantized: the same classes, outputs within a few
    hundredths."""
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
    # The autoencoder, its BatchNorms folded, against Keras running the .h5 (MLPerf's ad01_fp32.tflite is
    # not the same weights: its outputs differ from the .h5's by up to 0.66 of +-40 on these inputs).
    from resnet8ptq.model_formats import load_keras

    vectors = rng.normal(0, 1, (32, 640)).astype(np.float32)
    ad = ort.InferenceSession(converted(AD_H5, AD_SHA256, "ad")).run(None, {"input": vectors})[0]
    reference = load_keras(assets_dir / AD_H5).predict(vectors, verbose=0)
    np.testing.assert_allclose(ad, reference, rtol=1e-4, atol=1e-4)


def user_onnx(path: Path, rescale: bool = False) -> Path:
    """A user's own CIFAR-10-shaped ONNX network the tool has never seen (random weights): NHWC raw pixels ->
    (with ``rescale``: Mul by 1/255, a Keras Rescaling layer) -> Transpose -> Conv -> Relu ->
    GlobalAveragePool -> Squeeze (axes as an input, as tf2onnx writes Keras' GlobalAveragePooling2D) -> Gemm
    -> Softmax."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    scaling = [helper.make_node("Mul", ["x", "inverse_255"], ["scaled"], name="rescaling")] if rescale else []
    graph = helper.make_graph(
        [
            *scaling,
            helper.make_node("Transpose", ["scaled" if rescale else "x"], ["nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Conv", ["nchw", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["relu"]),
            helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
            helper.make_node("Squeeze", ["pooled", "axes"], ["features"]),
            helper.make_node("Gemm", ["features", "fc", "fc_b"], ["logits"], transB=1),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        ],
        "user_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32, 32, 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        [
            numpy_helper.from_array(rng.normal(0, 0.01, (8, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.zeros(8, np.float32), "b"),
            numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
            numpy_helper.from_array(rng.normal(0, 1, (10, 8)).astype(np.float32), "fc"),
            numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
            *([numpy_helper.from_array(np.float32(1 / 255), "inverse_255")] if rescale else []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_users_onnx_network_runs_in_onnx_runtime_and_pytorch(
    run_cli, initialised_store: Path, tmp_path: Path
) -> None:
    """``model=custom model.path=FILE.onnx`` on CIFAR-10, no code changed: its Squeeze is made a static
    Reshape, which torch.export takes (it refused the Squeeze's run-time axes as data-dependent)."""
    model = user_onnx(tmp_path / "user_net.onnx")
    client = sweep(
        run_cli, tmp_path, initialised_store,
        "-m", "model=custom", f"model.path={model}", "backend=onnx,torch", "dtype=int8",
        "report.enabled=false", "layer_analysis=false", "mlflow.log_models=false",
    )  # fmt: skip
    quantized = runs(client, "true")
    assert sorted(run.info.run_name for run in quantized) == [
        "custom-onnx-int8-int8-minmax-pt",
        "custom-torch-int8-int8-minmax-pt",
    ]
    assert all(run.info.status == "FINISHED" and run.data.tags["model"] == "custom" for run in quantized)
    assert {"class_acc/airplane", "class_acc/truck"} <= set(quantized[0].data.metrics)  # named by the data


def global_pool_network(path: Path) -> Path:
    """A seeded Keras CNN ending as most of a user's do: convolutions, GlobalAveragePooling2D (ONNX's
    GlobalAveragePool, PyTorch's mean over H and W, TFLite's MEAN), a dense layer."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu", bias_initializer="random_normal")(inputs)
    x = keras.layers.Conv2D(16, 3, activation="relu", bias_initializer="random_normal")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    keras.Model(inputs, keras.layers.Dense(4, bias_initializer="random_normal")(x)).save(path)
    return path


def test_a_global_average_pool_runs_on_the_integer_device_in_every_toolchain(
    run_cli, initialised_store: Path, tmp_path: Path
) -> None:
    """Keras' GlobalAveragePooling2D on the integer device: bit for bit LiteRT's reference MEAN (its 1/count
    folded into the requantization), ONNX Runtime's and PyTorch's float pools up to near ties."""
    rng = np.random.default_rng(5)
    data = tmp_path / "gap.npz"
    np.savez(
        data,
        calibration_inputs=rng.random((32, 16, 16, 3), dtype=np.float32),
        test_inputs=rng.random((400, 16, 16, 3), dtype=np.float32),
        test_labels=rng.integers(0, 4, 400),
    )
    client = sweep(
        run_cli, tmp_path, initialised_store,
        "-m", "model=custom", f"model.path={global_pool_network(tmp_path / 'gap.h5')}", "model.sha256=null",
        "backend=onnx,torch,tflite", "dtype=int8", "device=integer", "data=npz", f"data.path={data}",
        "layer_analysis=false", "mcu.enabled=false", "report.enabled=false", "mlflow.log_models=false",
    )  # fmt: skip
    quantized = {run.data.tags["backend"]: run for run in runs(client, "true")}
    assert sorted(quantized) == ["onnx", "tflite", "torch"]
    assert all(run.info.status == "FINISHED" for run in quantized.values())
    differing = {name: run.data.metrics["device_differing_predictions"] for name, run in quantized.items()}
    assert differing["tflite"] == 0, differing
    assert differing["onnx"] <= 20 and differing["torch"] <= 20, differing  # 5 %: ties of close logits
