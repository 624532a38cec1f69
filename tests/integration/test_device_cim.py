"""A crossbar sweep on the real model (issues 22, 41): one quantization, two ADC range rules; a 4-bit ADC
calibrated for least error per column keeps the accuracy that covering the largest sum loses, and its ranges
are logged per column. An ideal crossbar (tiles, bit-serial inputs, sliced weights, no ADC) predicts exactly
as the integer device. The export is a specification: a NumPy reader of its files alone
(export_reader.py) recomputes a logged crossbar run's predictions, and other crossbars' logits. Its own
module, so that it runs in another xdist worker than the shared sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.backends.onnx.integer import integer_model
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.device.adc import adc_table
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.evaluate import adc_steps, arithmetic, dac_ranges
from resnet8ptq.device.executor import execute
from resnet8ptq.device.export import export, export_crossbar
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.hardware import Hardware
from resnet8ptq.spec import QuantSpec
from tests.integration import pinned
from tests.integration.export_reader import crossbar_accumulate, predict, quantize_input, rebuild

pytestmark = [pytest.mark.device, pytest.mark.slow]

CIM_SWEEP = (
    "-m",
    "backend=onnx",
    "dtype=int8",
    "per_channel=true",
    "device=cim",
    "device.rows=128",
    "device.adc_bits=4",
    "device.adc_range=max,mse",
    "device.bias_correction=false,true",
    "layer_analysis=false",
    "mlflow.log_models=false",
)
TARGET_4_BITS = 0.80
"""Issue 41's target for a 4-bit ADC at 128 rows on the full test set (measured 82.21 % on an Intel Xeon)."""
COLUMNS = 16 + 2 * 16 * 2 + 2 * 32 + 32 * 3 + 32 + 64 * 3 + 64 * 5 + 64 + 10
"""ADC columns of ResNet8 at 128 rows (tiles × outputs per conv/dense layer, one cell per weight)."""


@pytest.fixture(scope="module")
def cim_runs(sweep_store) -> tuple[Path, list[Run]]:
    return sweep_store("cim", *CIM_SWEEP)


def pick(runs: list[Run], adc_range: str, corrected: bool = False) -> Run:
    """The sweep's run with that ADC range, with or without device-aware bias correction."""
    (found,) = [
        run
        for run in runs
        if run.data.tags["device.adc_range"] == adc_range and run.info.run_name.endswith("-bc") == corrected
    ]
    return found


def test_a_device_sweep_quantizes_once(cim_runs: tuple[Path, list[Run]]) -> None:
    _, runs = cim_runs
    first, second = pick(runs, "max"), pick(runs, "mse")
    assert runs[0] == first and len(runs) == 4
    assert first.info.run_name.endswith("-cim-r128-adc4-max") and second.info.run_name.endswith(
        "-cim-r128-adc4"
    )
    assert pick(runs, "mse", corrected=True).info.run_name.endswith("-cim-r128-adc4-bc")
    assert all(run.data.tags["device.quantization_run"] == first.info.run_name for run in runs[1:])
    assert "device.quantization_run" not in first.data.tags
    for key in ("quantize_seconds", "calib_seconds", "accuracy"):
        assert first.data.metrics[key] == second.data.metrics[key]
    assert len({run.data.tags["config_hash"] for run in runs}) == 4


def test_a_4_bit_adc_calibrated_for_least_error_keeps_the_accuracy(cim_runs: tuple[Path, list[Run]]) -> None:
    """Covering the largest partial sum leaves typical sums a few codes; the least-error range per column
    clips the rare large sums and meets the target on the full test set, with or without bias correction."""
    _, runs = cim_runs
    largest, least_error = pick(runs, "max"), pick(runs, "mse")
    assert least_error.data.metrics["accuracy_device"] >= TARGET_4_BITS
    assert largest.data.metrics["accuracy_device"] < least_error.data.metrics["accuracy_device"] - 0.1
    assert pick(runs, "mse", corrected=True).data.metrics["accuracy_device"] >= TARGET_4_BITS


def test_bias_correction_is_logged_and_exported(cim_runs: tuple[Path, list[Run]], tmp_path: Path) -> None:
    """`device.bias_correction=true`: every output channel's correction in device/bias_corrections.csv, and
    the exported integer model's biases are the plain run's less exactly those corrections."""
    workdir, runs = cim_runs
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    plain, corrected = (
        Path(
            client.download_artifacts(
                pick(runs, "mse", flag).info.run_id, "device", str(tmp_path / str(flag))
            )
        )
        for flag in (False, True)
    )
    assert not (plain / "bias_corrections.csv").exists()
    table = pd.read_csv(corrected / "bias_corrections.csv")
    assert len(table) == 16 * 3 + 32 * 3 + 64 * 3 + 10 and (table["correction"] != 0).any()
    layers = json.loads((corrected / "integer_model.json").read_text())["layers"]
    index = {layer["name"]: layer["index"] for layer in layers if layer["kind"] == "Conv"}
    assert set(table["layer"]) == set(index)
    with np.load(plain / "integer_model.npz") as before, np.load(corrected / "integer_model.npz") as after:
        for name, position in index.items():
            shift = table[table["layer"] == name].sort_values("channel")["correction"].to_numpy()
            key = f"{position:02d}/bias"
            np.testing.assert_array_equal(after[key], before[key] - shift, err_msg=name)


def test_the_adc_ranges_are_logged_per_column(cim_runs: tuple[Path, list[Run]], tmp_path: Path) -> None:
    workdir, runs = cim_runs
    run = pick(runs, "mse")
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    table = pd.read_csv(client.download_artifacts(run.info.run_id, "device/adc_steps.csv", str(tmp_path)))
    assert len(table) == COLUMNS and set(table["granularity"]) == {"column"}
    assert (table["code_max"] - table["code_min"] == 15).all()  # a 4-bit ADC's 16 codes
    steps = table["adc_step"].to_numpy()
    assert np.all(steps >= 1) and np.all(np.log2(steps) == np.round(np.log2(steps)))  # powers of two
    assert (table["range_low"] == table["code_min"] * table["adc_step"]).all()
    last = table[table["layer"] == table["layer"].iloc[-1]]
    assert list(last["column"]) == list(range(10)) and set(last["tile"]) == {0}  # the dense layer: 10 outputs


RESNET8 = [
    *[(32 * 32, 16, terms) for terms in (3 * 9, 16 * 9, 16 * 9)],
    *[(16 * 16, 32, terms) for terms in (16 * 9, 32 * 9, 16)],
    *[(8 * 8, 64, terms) for terms in (32 * 9, 64 * 9, 32)],
    (1, 10, 64),
]
"""ResNet8's conv/dense layers from its architecture (MLPerf Tiny): output positions, outputs, terms."""


def test_the_actions_are_counted_from_the_layer_shapes(
    cim_runs: tuple[Path, list[Run]], tmp_path: Path
) -> None:
    """128 rows, the whole input at once, one cell a weight: ResNet8's 12.5 M multiply-accumulates, one ADC
    conversion per tile and output, each row driven once per output position; the table has every layer."""
    workdir, runs = cim_runs
    metrics = pick(runs, "mse").data.metrics
    assert metrics["device_macs"] == sum(p * o * k for p, o, k in RESNET8) == 12_501_632
    assert metrics["device_adc_conversions"] == sum(p * o * math.ceil(k / 128) for p, o, k in RESNET8)
    assert metrics["device_row_activations"] == sum(p * k for p, _, k in RESNET8)
    assert metrics["device_cells"] == sum(2 * o * k for _, o, k in RESNET8)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    table = pd.read_csv(
        client.download_artifacts(pick(runs, "mse").info.run_id, "device/actions.csv", str(tmp_path))
    )
    convs = table[table["kind"].isin(["conv", "dense"])]
    assert len(convs) == len(RESNET8) and (convs["mean_input"].between(0, 1)).all()
    assert (convs["mean_cell"].between(0, 0.5)).all()  # a pair's other cell is empty


def test_a_crossbar_run_logs_what_its_chip_costs(cim_runs: tuple[Path, list[Run]], tmp_path: Path) -> None:
    """The 4-bit crossbar's energy is its ADC conversions times hwcomponents-adc's energy per conversion plus
    the other components', per layer as in total; its latency and area are logged with the model named."""
    from resnet8ptq.components.config import COMPONENTS

    workdir, runs = cim_runs
    run = pick(runs, "mse")
    metrics, tags = run.data.metrics, run.data.tags
    assert "hwcomponents-adc 1.0.21" in tags["device.cost_model"] and "22 nm" in tags["device.cost_model"]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    parts = pd.read_csv(client.download_artifacts(run.info.run_id, "device/components.csv", str(tmp_path)))
    (adc,) = parts[parts["component"] == "adc"].itertuples()
    assert adc.model == "hwcomponents_adc.ADC" and "n_bits=4" in adc.attributes
    assert metrics["device_energy_uj_adc"] == pytest.approx(
        metrics["device_adc_conversions"] * adc.energy * 1e6
    )
    layers = pd.read_csv(client.download_artifacts(run.info.run_id, "device/costs.csv", str(tmp_path)))
    assert len(layers) == len(pd.read_csv(client.download_artifacts(
        run.info.run_id, "device/actions.csv", str(tmp_path))))  # fmt: skip
    for name in COMPONENTS[:-1]:  # leakage is the chip's, over the whole inference
        assert layers[name].sum() == pytest.approx(metrics[f"device_energy_uj_{name}"]), name
    assert layers["latency"].sum() == pytest.approx(metrics["device_latency_us"])
    assert metrics["device_energy_uj"] == pytest.approx(
        sum(metrics[f"device_energy_uj_{n}"] for n in COMPONENTS)
    )
    assert metrics["device_tops_per_w"] == pytest.approx(
        2 * metrics["device_macs"] / (metrics["device_energy_uj"] * 1e-6) / 1e12
    )
    assert metrics["device_area_mm2_adc"] > 0 and metrics["device_energy_uj_mac"] == 0


def test_the_calibrated_crossbar_is_the_pinned_one(cim_runs: tuple[Path, list[Run]]) -> None:
    """128 rows, a 4-bit ADC, the default range rule: the same model, integer form and device predictions as
    on the CPU kind they were pinned on (tests/integration/pinned.py)."""
    _, runs = cim_runs
    tags = pick(runs, "mse").data.tags
    assert tags["device.adc_range"] == DeviceConfig().adc_range  # the default rule
    pinned.check("crossbar", tags, Hardware.from_tags(tags))


@pytest.mark.parametrize(
    "crossbar",
    [Crossbar(rows=128), Crossbar(rows=64, dac_bits=2, bits_per_cell=4, cells_per_weight=2)],
    ids=["tiles", "bit-serial-sliced"],
)
def test_an_ideal_crossbar_predicts_as_the_integer_device(
    onnx_backend, crossbar: Crossbar, canonical_model, data, tmp_path: Path
) -> None:
    """Every effect off (no ADC, no noise): the crossbar's logits equal the integer device's, image for image
    (the whole test set for tiles; 1,000 images bit-serially, where each image costs 8 slice pairs)."""
    calibration, images, _ = data
    spec = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=True)
    quantized = onnx_backend(native=False).quantize(canonical_model.onnx_path, calibration, spec, tmp_path)
    model = integer_model(quantized.path)
    images = images if crossbar.dac_bits == 8 else images[:1000]
    ideal, _ = execute(model, images)
    on_crossbar, _ = execute(model, images, CrossbarArithmetic(crossbar), batch_size=100)
    assert np.array_equal(on_crossbar, ideal)


READER_IMAGES = 300
"""Test images the NumPy reader of the export recomputes (its einsum-free loops cost ~10 ms an image)."""


def read_export(directory: Path, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last layer's integers and the predictions, from ``directory``'s files alone (export_reader.py)."""
    description = json.loads((directory / "integer_model.json").read_text())
    crossbar = json.loads((directory / "crossbar.json").read_text())
    with np.load(directory / "integer_model.npz") as npz:
        arrays = dict(npz)
    table = pd.read_csv(directory / "adc_steps.csv") if (directory / "adc_steps.csv").exists() else None
    accumulate = crossbar_accumulate(crossbar, table)
    tensors, _ = rebuild(description, arrays, quantize_input(description, images), accumulate)
    logits = tensors[description["layers"][-1]["output"]].reshape(len(images), -1)
    return logits, predict(description, arrays, logits)


@pytest.mark.parametrize("corrected", [False, True], ids=["plain", "bias-corrected"])
def test_the_export_rebuilds_the_crossbar_run(
    cim_runs: tuple[Path, list[Run]], corrected: bool, data, tmp_path: Path
) -> None:
    """The 4-bit least-error run's device/ files, read by NumPy alone, give its logged device predictions
    (which differ from the reference's on some of these images: the ADC is in the rebuilt arithmetic), with
    the corrected biases where the run corrected them."""
    workdir, runs = cim_runs
    run = pick(runs, "mse", corrected)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    directory = Path(client.download_artifacts(run.info.run_id, "device", str(tmp_path)))
    _, images, _ = data
    _, predicted = read_export(directory, images[:READER_IMAGES])
    logged = pd.read_csv(directory / "predictions.csv").iloc[:READER_IMAGES]
    assert (logged["device"] != logged["reference"]).any()
    assert np.array_equal(predicted, logged["device"].to_numpy())
    crossbar = json.loads((directory / "crossbar.json").read_text())
    sample = crossbar["calibration"]
    assert (sample["per_class"], sample["seed"], len(sample["indices"])) == (100, 42, 1000)
    assert crossbar["settings"]["adc_bits"] == 4 and "ties to even" in crossbar["conventions"]["adc"]


@pytest.mark.parametrize(
    "device",
    [
        DeviceConfig(
            kind="cim",
            rows=64,
            adc_bits=5,
            dac_bits=2,
            dac_range="percentile",
            dac_percentile=99.0,
            bits_per_cell=4,
            cells_per_weight=2,
            adc_step="free",
            adc_granularity="tile",
        ),
        DeviceConfig(
            kind="cim",
            rows=100,
            adc_bits=6,
            adc_range="max",
            adc_granularity="layer",
            adc_window="symmetric",
            accumulator_bits=16,
        ),
    ],
    ids=["bit-serial-clipped-sliced-free-tile", "layer-symmetric-saturating"],
)
def test_the_export_specifies_other_crossbars(
    onnx_backend, device: DeviceConfig, canonical_model, data, tmp_path: Path
) -> None:
    """Bit-serial inputs clipped to calibrated DAC ranges, sliced weights, free steps per tile; one symmetric
    range per layer and a 16-bit accumulator that saturates: the reader's logits equal the crossbar model's,
    integer for integer."""
    calibration, images, _ = data
    images = images[:100]
    spec = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=True)
    quantized = onnx_backend(native=False).quantize(canonical_model.onnx_path, calibration, spec, tmp_path)
    model = integer_model(quantized.path)
    dac = dac_ranges(model, device, calibration[:200])  # any sample: the test checks the reader
    steps = adc_steps(model, device, calibration[:200], dac=dac)
    logits, _ = execute(model, images, arithmetic(device, 0, steps, dac), device.images_per_step)
    export(model, images, tmp_path / "device")
    export_crossbar(model, device, {"per_class": 100, "seed": 42}, tmp_path / "device", dac)
    if device.dac_range == "percentile":  # the clip is in effect: some layer's DAC drops input bits
        layers = json.loads((tmp_path / "device" / "crossbar.json").read_text())["layers"]
        assert any(entry["input_range"] != entry["quantized_input_range"] for entry in layers)
    adc_table(steps).to_csv(tmp_path / "device" / "adc_steps.csv", index=False)
    rebuilt, _ = read_export(tmp_path / "device", images)
    assert np.array_equal(rebuilt, logits)
