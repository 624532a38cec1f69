"""The run explorer's pure helpers (resnet8ptq/explore/): the store and UI addresses, filtering runs, the
layer statistics, pairing a run's layers with the FP32 ones, the layer analysis lookup, the images two runs
disagree on, and the sweep maps."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import resnet8ptq.explore as ex


def test_tracking_uri_from_argument_then_environment_then_the_tools_default() -> None:
    assert (
        ex.tracking_uri({"tracking-uri": "sqlite:///a.db"}, {"MLFLOW_TRACKING_URI": "x"}) == "sqlite:///a.db"
    )
    assert ex.tracking_uri({}, {"MLFLOW_TRACKING_URI": "postgresql://h/db"}) == "postgresql://h/db"
    assert ex.tracking_uri({}, {}) == "sqlite:///mlflow.db"


def test_ui_links_go_to_the_tracking_server_or_make_ui() -> None:
    assert ex.ui_base("http://tracker:5000/") == "http://tracker:5000"
    assert ex.ui_base("sqlite:///mlflow.db") == "http://127.0.0.1:5000"
    assert ex.ui_base("sqlite:///mlflow.db", "http://ui:8080/") == "http://ui:8080"
    assert ex.run_url("http://ui", "3", "abc") == "http://ui/#/experiments/3/runs/abc"


def _table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_id": ["t2", "o2", "f1", "o1", "p1"],
            "backend": ["tflite", "onnx", "onnx", "onnx", "tflite"],
            "kind": ["quantized", "quantized", "fp32", "quantized", "published"],
            "status": ["FINISHED", "FAILED", "FINISHED", "FINISHED", "FINISHED"],
            "bits": ["a8w8", "a8w8", "fp32", "a8w4", "a8w8"],
        }
    )


def test_filters_keep_rows_with_a_chosen_value_and_empty_choices_keep_all() -> None:
    table = _table()
    assert ex.filter_runs(table, {"backend": [], "bits": []}).equals(table)
    assert ex.filter_runs(table, {"backend": ["onnx"], "bits": ["a8w8", "a8w4"]})["run_id"].tolist() == [
        "o2",
        "o1",
    ]


def test_layer_view_opens_on_the_newest_finished_quantized_run_of_each_backend() -> None:
    assert ex.default_layer_runs(_table()) == ["t2", "o1"]  # not the failed o2, the FP32 or published runs


def test_an_experiment_without_runs_is_an_empty_table_with_every_column() -> None:
    table = ex.runs_table([])
    assert table.empty and set(ex.TABLE_COLUMNS) <= set(table.columns)
    assert ex.default_layer_runs(table) == [] and ex.filter_runs(table, {"backend": ["onnx"]}).empty
    assert ex.fixed(table, ["backend"]) == "" and ex.accuracy_maps(table, "a", "b", "accuracy", []) == []


def test_dequantize_and_the_grid_statistics() -> None:
    integers = np.array([[-127, 0, 127, 5], [3, -3, 0, 1]])
    scale, zero_point = np.array([0.5, 2.0], np.float32), np.array([0, 1])
    assert ex.dequantize(integers, scale, zero_point).tolist() == [[-63.5, 0, 63.5, 2.5], [4, -8, -2, 0]]
    assert ex.grid_ends_share(integers, -127, 127) == 2 / 8
    assert ex.grid_ends_share(integers, -3, 3) is None  # integers off the grid: the grid is not this one
    # 63.74 / 0.5 rounds to 127 (on the grid); -63.8 / 0.5 to -128 and 260 / 2 + 1 to 131 (clipped)
    fp32 = np.array([[-63.8, 0.0, 63.74, 1.0], [4.0, 260.0, -2.0, 0.0]])
    assert ex.clipped_share(fp32, scale, zero_point, -127, 127) == 2 / 8


def test_weight_grid_follows_the_tools_rule() -> None:
    assert ex.weight_range({"dtype.weight": "int8"}) == (-127, 127)
    assert ex.weight_range({"dtype.weight": "uint8", "per_channel": "false"}) == (0, 255)
    assert ex.weight_range({"dtype.weight": "int8", "dtype.weight_bits": "4"}) == (-7, 7)
    assert ex.weight_range({"dtype.weight": "int8", "reduce_range": "true"}) == (-64, 64)


def test_a_layer_cut_to_one_channel() -> None:
    layer = ex.LayerWeights(
        layer="conv",
        name="conv",
        integers=np.arange(12).reshape(3, 4, 1, 1),
        zero_point=np.zeros(3, int),
        scale=np.array([1.0, 2.0, 3.0]),
        qmin=-127,
        qmax=127,
        fp32=np.ones((3, 4, 1, 1), np.float32),
        matched_by="name",
    )
    one = layer.select(1)
    assert (
        one.channels == 1 and one.integers.ravel().tolist() == [4, 5, 6, 7] and one.fp32.shape == (1, 4, 1, 1)
    )
    assert layer.select(-1) is layer and layer.select(None) is layer


def _fp32(name: str, node: str, outputs: tuple[str, ...], weight: np.ndarray) -> ex.Fp32Layer:
    return ex.Fp32Layer(name, node, outputs, weight.astype(np.float32))


def _conv(name: str, weight: np.ndarray, scale: float = 0.01) -> SimpleNamespace:
    """An integer-form conv as a reader gives it: integers, per-channel scales and zero points."""
    integers = np.rint(weight / scale).astype(np.int32)
    channels = len(weight)
    return SimpleNamespace(
        name=name,
        weight=integers,
        weight_scale=np.full(channels, scale),
        weight_zero_point=np.zeros(channels),
    )


def test_layers_pair_by_output_name_then_onnx_node_then_weight_values() -> None:
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(0, 0.3, (4, 2, 3, 3)) for _ in range(3))
    fp32 = [
        _fp32("conv2d_1", "model_1/conv2d_1/BiasAdd", ("bn_1/add_1", "activation_1/Relu"), a),
        _fp32("conv2d_2", "model_1/conv2d_2/BiasAdd", ("bn_2/add_1",), b),
        _fp32("conv2d_3", "model_1/conv2d_3/BiasAdd", ("conv2d_3/BiasAdd",), c),
    ]
    convs = [_conv("activation_1/Relu", a), _conv("conv2d_1", b), _conv("model/conv2d_7/BiasAdd", c)]
    pairs = ex.match_layers(convs, fp32, {"conv2d_1": "model_1/conv2d_2/BiasAdd"})
    assert [(layer.weight_name, how.split(" (")[0]) for _, layer, how in pairs] == [
        ("conv2d_1", "name"),  # ONNX Runtime / TFLite: the ReLU's output
        ("conv2d_2", "name"),  # PyTorch: its program node, mapped to the ONNX node
        ("conv2d_3", "weight values"),  # a published model's own names: the closest weights
    ]


def test_weight_values_match_only_a_close_unclaimed_layer_of_the_same_shape() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 0.3, (4, 2, 3, 3)), rng.normal(0, 0.3, (4, 2, 3, 3))
    fp32 = [_fp32("conv2d_1", "n1", ("x",), a), _fp32("conv2d_2", "n2", ("y",), b)]
    (pair,) = ex.match_layers([_conv("other", rng.normal(0, 0.3, (4, 2, 3, 3)))], fp32)
    assert pair[1] is None and pair[2] == ""  # unrelated weights: below 10 dB against both
    pairs = ex.match_layers([_conv("x", a), _conv("mystery", a)], fp32)
    assert pairs[1][1] is None  # conv2d_1 is taken by name; conv2d_2's weights are not these


def test_layer_sqnr_names_weights_by_their_keras_layer_and_outputs_by_tensor() -> None:
    table = pd.DataFrame(
        {
            "layer": ["dense_1/MatMul", "conv2d_1", "activation_1/Relu", "dense_1/BiasAdd"],
            "kind": ["weight", "weight", "activation", "activation"],
            "sqnr_db": [44.9, 45.9, 34.1, 28.5],
        }
    )

    def layer(name: str, outputs: tuple[str, ...]) -> SimpleNamespace:
        return SimpleNamespace(layer=name, outputs=outputs)

    assert ex.layer_sqnr(table, layer("dense_1/Cast", ("dense_1/BiasAdd",))) == (
        44.9,
        "dense_1/BiasAdd",
        28.5,
    )
    assert ex.layer_sqnr(table, layer("conv2d_1", ("bn/add_1", "activation_1/Relu"))) == (
        45.9,
        "activation_1/Relu",
        34.1,
    )
    assert ex.layer_sqnr(table, layer("conv2d_2", ("bn_2/add_1",))) == (None, "", None)
    assert ex.layer_sqnr(None, layer("conv2d_1", ())) == (None, "", None)


def test_disagreements_are_the_images_one_run_gets_right_and_the_other_wrong() -> None:
    def predictions(predicted: list[int]) -> pd.DataFrame:
        return pd.DataFrame({"image": range(5), "label": [0, 1, 2, 3, 4], "predicted": predicted}).set_index(
            "image"
        )

    a, b = predictions([0, 1, 9, 9, 4]), predictions([0, 9, 2, 8, 4])
    only_a, only_b = ex.disagreements(a, b)
    assert only_a.tolist() == [1] and only_b.tolist() == [2]
    with pytest.raises(ValueError, match="same test images"):
        ex.disagreements(a, predictions([0, 1, 2, 3, 4]).iloc[:4])


def test_class_accuracy_in_the_runs_class_order_from_the_logged_metrics() -> None:
    accuracy = ex.class_accuracy({}, {"class_acc/cat": 0.7, "class_acc/airplane": 0.9, "accuracy": 0.8})
    assert accuracy.index[0] == "airplane" and accuracy["airplane"] == 0.9 and accuracy["cat"] == 0.7
    assert np.isnan(accuracy["truck"])  # a ResNet8 run made before the classes tag: CIFAR-10's classes
    tags = {"model": "kws", "classes": '["yes", "no"]'}
    kws = ex.class_accuracy(tags, {"class_acc/no": 0.5, "class_acc/yes": 0.25})
    assert list(kws.index) == ["yes", "no"] and list(kws) == [0.25, 0.5]


def _sweep() -> pd.DataFrame:
    rows = []
    for start, (backend, w, a, accuracy, seed) in enumerate(
        [
            ("onnx", 4, 8, 0.55, "42"),
            ("onnx", 8, 8, 0.86, "42"),
            ("onnx", 8, 6, 0.84, "42"),
            ("torch", 8, 8, 0.87, "42"),
            ("onnx", 8, 8, 0.80, "42"),  # an older run of a cell and seed: the newest counts
            ("torch", 8, 8, 0.85, "0"),  # another seed: the cell is the mean over seeds
            ("torch", 8, 8, 0.83, "1"),
        ]
    ):
        rows.append(
            {
                "run_id": f"r{start}",
                "run_name": f"{backend}-a{a}w{w}",
                "status": "FINISHED",
                "start_time": 100 - start,
                "backend": backend,
                "calib": "minmax",
                "weight_bits": w,
                "activation_bits": a,
                "accuracy": accuracy,
                "seed": seed,
            }
        )
    rows.append({**rows[0], "run_id": "failed", "status": "FAILED", "weight_bits": 2, "accuracy": np.nan})
    return pd.DataFrame(rows)


def test_accuracy_maps_one_per_group_mean_over_seeds_of_the_newest_runs() -> None:
    sweep = _sweep()
    assert ex.varying(sweep, ["backend", "calib", "weight_bits"]) == ["backend", "weight_bits"]
    assert ex.fixed(sweep, ["backend", "calib"]) == "calib=minmax"
    onnx, torch = ex.accuracy_maps(sweep, "weight_bits", "activation_bits", "accuracy", ["backend"])
    assert onnx.title == "backend=onnx" and torch.title == "backend=torch"
    assert onnx.rows == [4, 8] and onnx.columns == [6, 8]
    assert onnx.cells[8, 8][:3] == (0.86, "r1", "onnx-a8w8") and onnx.cells[8, 8].seeds == 1
    assert np.isnan(onnx.cells[8, 8].std)
    assert (4, 6) not in onnx.cells
    mean = torch.cells[8, 8]
    assert mean.value == pytest.approx(0.85) and mean.std == pytest.approx(0.02) and mean.seeds == 3
    assert mean.run_id == "r3"  # the link: the newest run of the cell
    (whole,) = ex.accuracy_maps(sweep, "weight_bits", "activation_bits", "accuracy", [])
    assert whole.title == "all runs" and whole.cells[8, 8].run_id == "r1"
    assert whole.cells[8, 8].seeds == 3  # seed 42's newest run (onnx, 0.86) with torch's seeds 0 and 1
    assert whole.cells[8, 8].value == pytest.approx((0.86 + 0.85 + 0.83) / 3)


def test_map_html_links_every_cell_to_its_run() -> None:
    sweep = _sweep()
    (onnx, _) = ex.accuracy_maps(sweep, "weight_bits", "activation_bits", "accuracy", ["backend"])
    html = ex.map_html(onnx, lambda run_id: f"http://ui/#/runs/{run_id}")
    for run_id, value in (("r0", "55.00"), ("r1", "86.00"), ("r2", "84.00")):
        assert f'href="http://ui/#/runs/{run_id}"' in html and f">{value}</a>" in html
    assert html.count("<td>—</td>") == 1  # w4 at 6 bits: no run
    (_, torch) = ex.accuracy_maps(sweep, "weight_bits", "activation_bits", "accuracy", ["backend"])
    html = ex.map_html(torch, lambda run_id: f"http://ui/#/runs/{run_id}")
    assert 'href="http://ui/#/runs/r3"' in html and ">85.00 ± 2.00</a>" in html and "of 3 seeds" in html
    assert ex.cell_color(0.55, 0.55, 0.86) == "rgb(215, 48, 39)"
    assert ex.cell_color(0.86, 0.55, 0.86) == "rgb(26, 152, 80)"
    assert ex.cell_color(0.5, 0.5, 0.5) == "rgb(26, 152, 80)"


def test_thumbnail_is_a_png_scaled_up() -> None:
    from PIL import Image

    image = np.zeros((32, 32, 3), np.uint8)
    image[0, 0] = (255, 0, 0)
    png = Image.open(io.BytesIO(ex.thumbnail(image, scale=3)))
    assert png.size == (96, 96) and png.getpixel((2, 2)) == (255, 0, 0) and png.getpixel((3, 3)) == (0, 0, 0)


def test_the_chip_frontier_is_the_reports_pareto_front_of_costed_runs() -> None:
    """Accuracy on the device against energy: the uncosted and the dominated runs are off the front."""
    table = pd.DataFrame(
        {
            "run_name": ["a", "b", "c", "d", "ideal"],
            "accuracy_device": [0.86, 0.82, 0.87, 0.85, 0.87],
            "device_energy_uj": [1.0, 0.9, 1.9, 1.4, np.nan],
            "device_area_mm2": [0.5, 0.4, 0.7, 0.6, np.nan],
        }
    )
    chips = ex.chip_frontier(table, "device_energy_uj")
    assert list(chips["run_name"]) == ["b", "a", "d", "c"]  # cheapest first, the uncosted one left out
    assert list(chips["on_front"]) == [True, True, False, True]
    assert set(ex.CHIP_COSTS) == {"device_energy_uj", "device_area_mm2"}
