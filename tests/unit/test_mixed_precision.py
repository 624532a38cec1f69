"""Mixed precision without quantizing: the layer rules on a small ONNX graph, ORT's overrides for raised
layers, the step loop against scripted runs in a local MLflow store, and the report sections it feeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType

from resnet8ptq.backends.onnx.widths import raised_overrides
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.errors import ConfigError, RaisedLayerError, TargetNotReached
from resnet8ptq.layers import check_raised, expected_raised, model_layers, raised_in, sharing
from resnet8ptq.report import writer as report
from resnet8ptq.search.objectives import REFUSED, trial_tag
from resnet8ptq.search.target import reach_target
from resnet8ptq.spec import LayerPrecision, QuantSpec, base_precision
from resnet8ptq.tracking.sweep import PARENT_RUN_ENV


def small_model() -> onnx.ModelProto:
    """input -> Transpose -> Conv -> Relu -> AveragePool -> Reshape -> Gemm: tensors named like tf2onnx's."""
    weights = [
        numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "model_1/conv/ReadVariableOp:0"),
        numpy_helper.from_array(np.zeros(2, np.float32), "model_1/conv/bias:0"),
        numpy_helper.from_array(np.ones((2, 10), np.float32), "model_1/dense/ReadVariableOp:0"),
        numpy_helper.from_array(np.array([-1, 2], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Transpose", ["input"], ["model_1/t:0"], perm=[0, 3, 1, 2]),
        helper.make_node(
            "Conv", ["model_1/t:0", "model_1/conv/ReadVariableOp:0", "model_1/conv/bias:0"], ["model_1/c:0"]
        ),
        helper.make_node("Relu", ["model_1/c:0"], ["model_1/r:0"]),
        helper.make_node("AveragePool", ["model_1/r:0"], ["model_1/p:0"], kernel_shape=[4, 4]),
        helper.make_node("Reshape", ["model_1/p:0", "shape"], ["model_1/f:0"]),
        helper.make_node("Gemm", ["model_1/f:0", "model_1/dense/ReadVariableOp:0"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4, 4, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 10])],
        weights,
    )
    return helper.make_model(graph)


def test_layers_are_named_as_the_analysis_names_them() -> None:
    layers = model_layers(small_model())
    assert {name: layer.kind for name, layer in layers.items()} == {
        "conv": "weight",
        "dense": "weight",
        "t": "activation",
        "c": "activation",
        "r": "activation",
        "p": "activation",
        "f": "activation",
        "out": "activation",
    }
    assert layers["conv"].tensor == "model_1/conv/ReadVariableOp:0"


def test_layers_that_take_their_inputs_quantization_follow_it() -> None:
    model = small_model()
    assert sharing(model) == {"p": "r", "f": "r"}  # the transposed graph input is quantized on its own
    assert expected_raised(["r", "conv"], model) == {"r", "p", "f", "conv"}
    assert expected_raised([], model) == set()


def test_raised_names_are_checked_before_any_work() -> None:
    model = small_model()
    check_raised(["r", "conv", "t"], model, activation_bits=8)
    with pytest.raises(RaisedLayerError, match=r"\['nope'\] are not layers of this model.*: c, conv, dense"):
        check_raised(["nope"], model, 8)
    with pytest.raises(RaisedLayerError, match="p takes the quantization of r; raise r instead"):
        check_raised(["p"], model, 8)
    with pytest.raises(RaisedLayerError, match="already 16 bits; raise weights only"):
        check_raised(["r"], model, 16)
    check_raised(["conv"], model, 16)
    with pytest.raises(ValueError, match=r"raised_layers names \['r'\] more than once"):
        QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), raised_layers=("r", "conv", "r"))


def test_what_a_saved_model_holds_wider_is_raised() -> None:
    layers = [
        LayerPrecision("conv", "weight", "int16", 16),
        LayerPrecision("dense", "weight", "uint8", 8),  # e.g. 7-bit per-channel uint8 stored as 0..128
        LayerPrecision("r", "activation", "uint16", 16),
        LayerPrecision("c", "activation", "uint8", 8),
    ]
    assert raised_in(layers, activation_bits=8) == ["conv", "r"]
    assert raised_in(layers, activation_bits=16) == ["conv"]  # 16-bit activations are the configuration
    assert base_precision(layers, "weight") == ("uint8", 8)
    assert base_precision(layers, "activation") == ("uint8", 8)
    with pytest.raises(RuntimeError, match="no quantized weight"):
        base_precision(layers[2:], "weight")


@pytest.mark.parametrize("per_channel", [False, True])
def test_ort_overrides_of_raised_layers(per_channel: bool) -> None:
    spec = QuantSpec(
        DtypeConfig("uint8", "uint8"),
        CalibConfig("minmax"),
        per_channel,
        raised_layers=("r", "conv", "dense"),
    )
    overrides = raised_overrides(small_model(), spec)
    assert overrides["model_1/r:0"] == [{"quant_type": QuantType.QUInt16}]  # the activation's signedness
    conv, dense = (
        overrides["model_1/conv/ReadVariableOp:0"][0],
        overrides["model_1/dense/ReadVariableOp:0"][0],
    )
    assert conv["quant_type"] == dense["quant_type"] == QuantType.QInt16  # weights: int16, symmetric
    assert conv["symmetric"] and not conv["reduce_range"]
    assert (conv.get("axis"), dense.get("axis")) == ((0, 1) if per_channel else (None, None))
    assert spec.raised_storage("activation") == "uint16" and spec.raised_storage("weight") == "int16"


# --- the step loop, on scripted runs ------------------------------------------------------------------------

FP32 = 0.8719
SQNR = {"r": 18.0, "c": 19.0, "p": 17.0, "f": 17.5, "t": 30.0, "conv": 38.0, "dense": 40.0}
"""A fake per-layer analysis: p and f are the lowest but take r's quantization, so they are never chosen."""
ACCURACY = {0: 0.8654, 1: 0.8680, 2: 0.8700, 3: 0.8705, 4: 0.8717, 5: 0.8718}
"""Accuracy by number of requested layers."""


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = MlflowClient()
    experiment = client.create_experiment("resnet8ptq", artifact_location=(tmp_path / "mlruns").as_uri())
    parent = client.create_run(experiment, run_name="parent", tags={"sweep": "true"}).info.run_id
    monkeypatch.setenv(PARENT_RUN_ENV, parent)
    client.experiment_id = experiment  # type: ignore[attr-defined]
    client.parent = parent  # type: ignore[attr-defined]
    return client


def scripted_run(client: MlflowClient, requests: list[list[str]]):
    """A stand-in for pipeline.run: logs what a real step logs, from ACCURACY and SQNR."""
    model = small_model()

    def run(cfg, output_dir: Path, tags: dict[str, str]) -> str:
        requested = list(cfg.raised_layers)
        requests.append(requested)
        raised = expected_raised(requested, model)
        run_tags = {
            "mlflow.parentRunId": client.parent,
            "quantized": "true",
            "backend": "onnx",
            "config_hash": f"hash{len(requested)}",
            **({"mixed_precision.raised": ",".join(sorted(raised))} if raised else {}),
            **({"mixed_precision.base_hash": "hash0"} if requested else {}),
            **tags,
        }
        run_id = client.create_run(
            client.experiment_id, run_name=f"step{len(requests)}", tags=run_tags
        ).info.run_id
        accuracy = ACCURACY[len(requested)]
        metrics = {"accuracy": accuracy, "accuracy_delta": accuracy - FP32, "model_size_bytes": 1e5}
        client.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
        output_dir.mkdir(parents=True)
        pd.DataFrame(
            [
                {"layer": layer, "kind": model_layers(model)[layer].kind, "sqnr_db": db}
                for layer, db in SQNR.items()
            ]
        ).to_csv(output_dir / "layer_sqnr.csv", index=False)
        pd.DataFrame(
            [
                {
                    "layer": layer,
                    "kind": model_layers(model)[layer].kind,
                    "dtype": "x",
                    "bits": 16 if layer in raised else 8,
                }
                for layer in SQNR
            ]
        ).assign(takes_quantization_of=lambda t: t["layer"].map(sharing(model))).to_csv(
            output_dir / "layer_precision.csv", index=False
        )
        client.log_artifacts(run_id, str(output_dir), "analysis")
        client.set_terminated(run_id, "FINISHED")
        return run_id

    return run


def target_cfg(**target):
    return OmegaConf.create(
        {"raised_layers": [], "target": {"layers_per_step": 1, "max_steps": None, **target}}
    )


def test_steps_raise_the_lowest_sqnr_layers_until_the_target(store: MlflowClient, tmp_path: Path) -> None:
    requests: list[list[str]] = []
    cfg = target_cfg(max_drop_points=0.1)
    result = reach_target(cfg, tmp_path / "out", scripted_run(store, requests))
    # r (18 dB; p and f follow it), c (19), t (30), then weights: conv (38), which reaches the target
    assert requests == [[], ["r"], ["r", "c"], ["r", "c", "t"], ["r", "c", "t", "conv"]]
    assert store.get_run(result).data.tags["mixed_precision.step"] == "4"
    outcome = store.get_run(store.parent).data.tags["mixed_precision.hash0"]
    assert (
        outcome.startswith("target 0.1 points, 5 steps: reached at step 4") and "drop 0.02 points" in outcome
    )


def test_a_bad_target_is_a_config_error_before_any_run(store: MlflowClient, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"target.layers_per_step=0: expected a positive number"):
        reach_target(target_cfg(max_drop_points=0.1, layers_per_step=0), tmp_path, scripted_run(store, []))


def test_an_unreachable_target_stops_with_why(store: MlflowClient, tmp_path: Path) -> None:
    requests: list[list[str]] = []
    with pytest.raises(
        TargetNotReached, match=r"target.max_steps=1 reached; best step 1: .* drop 0\.39 points"
    ):
        reach_target(
            target_cfg(max_drop_points=0.0, max_steps=1), tmp_path / "a", scripted_run(store, requests)
        )
    assert requests == [[], ["r"]]
    with pytest.raises(TargetNotReached, match=r"no layer left to raise .*best step 3: .*drop 0\.01 points"):
        reach_target(
            target_cfg(max_drop_points=0.0, layers_per_step=2), tmp_path / "b", scripted_run(store, [])
        )
    assert "not reached: no layer left" in store.get_run(store.parent).data.tags["mixed_precision.hash0"]


def test_report_shows_the_steps_and_the_search(store: MlflowClient, tmp_path: Path) -> None:
    reach_target(
        target_cfg(max_drop_points=0.1, layers_per_step=2), tmp_path / "out", scripted_run(store, [])
    )
    trials = {trial_tag(0): "refused: backend=tflite runs dtype=int8 ...; not uint8-int8"}
    runs = store.search_runs([store.experiment_id], f"tags.mlflow.parentRunId = '{store.parent}'")
    trials |= {
        trial_tag(i + 1): run.info.run_id for i, run in enumerate(sorted(runs, key=lambda r: r.info.run_name))
    }
    search = {"search.objectives": "accuracy,model_size_bytes", "search.directions": "maximize,minimize"}
    store.log_batch(store.parent, tags=[RunTag(k, v) for k, v in (search | trials).items()])
    html = report.write_report(store.parent, tmp_path / "report", tracking_uri=store.tracking_uri)
    text = (html.parent / "report.md").read_text()
    assert "## Mixed precision" in text and "## Optuna search" in text
    assert (
        f"Refused by the backend (failed trials, the search went on): #0: {REFUSED.removeprefix('refused: ')}"
        in text
    )
    steps = text.split("## Mixed precision")[1].split("##")[0]
    assert "| 1 | 4 | c, f, p, r | 87.00 | 86.33-87.64 | 0.19 | — | no |" in steps  # 2 asked, 2 follow r
    assert "| 2 | 6 | conv, t | 87.17 | 86.50-87.81 | 0.02 | — | yes |" in steps  # (no predictions logged)
    # all steps have the same size: the Pareto front is the most accurate step
    front = text.split("**Pareto front**")[1].split("\n")[0]
    assert front.startswith(" (1 of 3 trials): #3 ")
    assert (html.parent / "report_search.png").is_file() and (
        html.parent / "report_mixed_precision.png"
    ).is_file()
