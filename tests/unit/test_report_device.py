"""The report's device section on a synthetic sweep: a crossbar grid (ADC bits x rows), a noise sweep, a chip
over time with and without drift compensation, and the ideal integer device, one quantized model."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.report import writer as report
from resnet8ptq.report.runs import device_columns
from tests.unit.test_report import AVX2, _log, _metrics, _run

pytestmark = pytest.mark.device

GRID = {(64, 4): 0.20, (64, 8): 0.86, (128, 4): 0.12, (128, 8): 0.85, (256, 4): 0.10, (256, 8): 0.80}
NOISE = {0.0: (0.868, 0.0), 0.02: (0.70, 0.01), 0.05: (0.30, 0.03)}
TIME = {  # (t_inference, drift_compensation) -> (accuracy, std): a PCM chip over time
    (0.0, False): (0.85, 0.004),
    (86400.0, False): (0.60, 0.02),
    (31536000.0, False): (0.20, 0.03),
    (0.0, True): (0.85, 0.004),
    (86400.0, True): (0.83, 0.005),
    (31536000.0, True): (0.78, 0.01),
}


def device_tags(**settings: object) -> dict[str, str]:
    """The tags a crossbar run logs today."""
    return DeviceConfig(kind="cim", **settings).tags()


def test_a_run_from_before_the_adc_rules_reads_as_max_per_layer() -> None:
    """Runs logged before issue 41 have `device.adc_range=calibrated` and no granularity or window tag: they
    ran the max rule per layer with a symmetric window, and their label says so."""
    old = {
        "device.kind": "cim",
        "device.rows": "128",
        "device.adc_bits": "4",
        "device.adc_range": "calibrated",
    }
    columns = device_columns(old)
    assert columns["device"] == "cim-r128-adc4-max-layer-sym"
    assert (columns["device_adc_granularity"], columns["device_adc_window"]) == ("layer", "symmetric")
    assert device_columns(device_tags(rows=128, adc_bits=4))["device"] == "cim-r128-adc4"


def test_a_chip_over_time_reads_back_from_its_tags() -> None:
    """A choice whose value is `none` stays a choice, a flag reads as a bool: the label is the run's own."""
    tags = device_tags(adc_bits=4, drift="pcm", t_inference=3600.0, drift_compensation=True, read_noise=0.01)
    columns = device_columns(tags)
    assert columns["device"] == "cim-adc4-pcm-t3600-gdc-rn0.01"
    assert columns["device_drift_compensation"] is True and columns["device_t_inference"] == 3600.0
    plain = device_columns(device_tags(adc_bits=4))
    assert plain["device_drift"] == "none" and plain["device_drift_compensation"] is False


def test_a_bias_corrected_run_is_labelled_apart() -> None:
    """`device.bias_correction` is the device's, not the crossbar's, and still names its runs: a sweep over it
    shows two rows, not two of one name."""
    corrected = device_columns(device_tags(rows=128, adc_bits=4, bias_correction=True))
    plain = device_columns(device_tags(rows=128, adc_bits=4))
    assert (corrected["device"], plain["device"]) == ("cim-r128-adc4-bc", "cim-r128-adc4")
    assert corrected["device_bias_correction"] is True and plain["device_bias_correction"] is False


def test_a_costed_runs_components_away_from_their_defaults_name_it_in_the_run_and_the_report() -> None:
    """A sweep over `components.power_gating` (or a preset's cell) gives runs of one crossbar that cost
    differently: the run name and the report's device label carry the settings away from their defaults, read
    back from the params as MLflow logs them (strings); at the defaults both stay as before."""
    from types import SimpleNamespace

    from resnet8ptq.components.config import ComponentsConfig
    from resnet8ptq.resolve import name_of_run

    tags = device_tags(rows=256, adc_bits=5) | {"device.cost_model": "hwcomponents ..."}
    params = {
        "components.power_gating": "True",
        "components.cell": "sonos",
        "components.tech_node_nm": "22.0",
    }
    assert device_columns(tags, params)["device"] == "cim-r256-adc5-cell-sonos-gated"
    assert device_columns(tags, {"components.power_gating": "False"})["device"] == "cim-r256-adc5"
    assert device_columns(device_tags(rows=256, adc_bits=5), params)["device"] == "cim-r256-adc5"  # uncosted
    components = ComponentsConfig(power_gating=True, cell="sonos")
    assert components.label() == "cell-sonos-gated" and ComponentsConfig().label() == ""
    assert (
        ComponentsConfig(cell="pcm", columns_per_adc=1, adc_rate=1.3e7).label() == "cell-pcm-rate1.3e+07-cpa1"
    )
    assert components.label("integer") == "" and ComponentsConfig(mac_units=32).label("integer") == "macs32"
    integer = DeviceConfig(kind="integer").tags() | {"device.cost_model": "hwcomponents ..."}
    assert device_columns(integer, params)["device"] == "int"  # the integer device has nothing to gate
    assert device_columns(integer, {"components.mac_units": "32"})["device_config"] == "int"
    device = DeviceConfig(kind="cim", rows=256, adc_bits=5)
    spec = SimpleNamespace(
        dtype=SimpleNamespace(label="int8-int8"), calib=SimpleNamespace(method="minmax", weights="minmax"),
        per_channel=True, reduce_range=False, raised_layers=(), layer_bits=(),
    )  # fmt: skip
    algo = SimpleNamespace(steps=[], device_aware=False, device_noise=False)
    assert name_of_run("onnx", spec, algo, device, "resnet8", components).endswith(
        "-cim-r256-adc5-cell-sonos-gated"
    )
    assert name_of_run("onnx", spec, algo, device, "resnet8", ComponentsConfig()).endswith("-cim-r256-adc5")
    off = ComponentsConfig(kind="none", power_gating=True)
    assert name_of_run("onnx", spec, algo, device, "resnet8", off).endswith("-cim-r256-adc5")


@pytest.fixture(scope="module")
def markdown(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("device-report")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.create_experiment("resnet8ptq", artifact_location=(root / "mlruns").as_uri())
    sweep_dir = root / "sweep"
    tags = {"sweep": "true", "sweep_kind": "sweep", "sweep_dir": str(sweep_dir), "overrides": "synthetic"}
    parent = client.create_run(experiment, run_name="sweep", tags=tags).info.run_id
    base = AVX2.tags() | {"backend": "onnx", "dtype.activation": "int8", "dtype.weight": "int8"}
    base |= {"calib": "minmax", "per_channel": "true", "execution": "native"}
    params = {"dtype": "int8", "calib": "minmax", "backend": "onnx", "data.seed": "42"}
    fp32 = _run(client, experiment, parent, "onnx-fp32", 1, quantized="false")
    _log(client, fp32, _metrics("fp32", 0.8719, 320_000, 900.0), {"backend": "onnx"}, AVX2.tags(), "FINISHED")
    runs = [({"device.kind": "integer"}, 0.8693, 0.0)]
    runs += [(device_tags(rows=r, adc_bits=b), accuracy, 0.0) for (r, b), accuracy in GRID.items()]
    runs += [(device_tags(weight_noise=s), accuracy, std) for s, (accuracy, std) in NOISE.items()]
    runs += [
        (device_tags(rows=128, adc_bits=8, drift="pcm", t_inference=t, drift_compensation=c), accuracy, std)
        for (t, c), (accuracy, std) in TIME.items()
    ]
    for start, (device, accuracy, std) in enumerate(runs, 10):
        run = _run(
            client, experiment, parent, f"run{start}", start, quantized="true", config_hash=f"h{start}"
        )
        metrics = _metrics("q", 0.8695, 110_000, 4000.0) | {
            "accuracy_device": accuracy,
            "accuracy_device_std": std,
            "accuracy_device_ci_low": accuracy - 2 * std - 0.005,
            "accuracy_device_ci_high": accuracy + 2 * std + 0.005,
            "device_differing_predictions": round((0.8695 - accuracy) * 10_000) + 20,
        }
        _log(client, run, metrics, params, base | device, "FINISHED")
    client.set_terminated(parent, "FINISHED")
    path = report.write_report(parent, tracking_uri=client.tracking_uri)
    return (path.parent / "report.md").read_text(), path.parent


def test_device_table_lists_every_device_run(markdown: tuple[str, Path]) -> None:
    text, _ = markdown
    section = text.split("## On the device", 1)[1]
    assert "| onnx int8 minmax per-channel | int | 86.95 | 86.93" in section
    assert "| onnx int8 minmax per-channel | cim-r64-adc8 | 86.95 | 86.00" in section
    assert "cim-n0.05" in section and "3.00" in section  # the std over draws of the noisiest device


def test_device_map_over_adc_bits_and_rows(markdown: tuple[str, Path]) -> None:
    text, directory = markdown
    assert "over adc bits × rows" in text
    assert "| rows \\ adc bits | ideal | 4 | 8 |" in text
    assert "| 64 | - | 20.0 | 86.0 |" in text and "| 256 | - | 10.0 | 80.0 |" in text
    assert (directory / "report_device_map.png").stat().st_size > 10_000


def test_accuracy_over_time_with_and_without_compensation(markdown: tuple[str, Path]) -> None:
    """A sweep over t_inference draws one curve per compensation setting and tabulates them."""
    text, directory = markdown
    assert "report_device_t_inference.png" in text
    assert (directory / "report_device_t_inference.png").stat().st_size > 10_000
    table = text.split("against `t_inference`:", 1)[1]
    assert "| configuration \\ t_inference | 0 | 86400 | 3.1536e+07 |" in table
    assert "| onnx int8 minmax per-channel, drift_compensation=False | 85.00 | 60.00 | 20.00 |" in table
    assert "| onnx int8 minmax per-channel, drift_compensation=True | 85.00 | 83.00 | 78.00 |" in table


def test_noise_chart(markdown: tuple[str, Path]) -> None:
    text, directory = markdown
    assert "report_device_noise.png" in text
    assert (directory / "report_device_noise.png").stat().st_size > 10_000


def test_plain_and_device_aware_models_side_by_side_over_seeds(tmp_path: Path) -> None:
    """Issue 45's comparison: per device, the plain model with calibrated ADC ranges, the model learned
    against the device with its learned steps and the one learned on noisy chips, each as mean ± std over
    its calibration seeds (the report's spread over seeds compares device runs by their accuracy on the
    device), named apart; the noise chart's points are each model's mean over its seeds."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("resnet8ptq", artifact_location=(tmp_path / "mlruns").as_uri())
    tags = {"sweep": "true", "sweep_kind": "sweep", "sweep_dir": str(tmp_path / "sweep"), "overrides": "x"}
    parent = client.create_run(experiment, run_name="sweep", tags=tags).info.run_id
    base = AVX2.tags() | {"backend": "onnx", "dtype.activation": "int8", "dtype.weight": "int8"}
    base |= {"calib": "minmax", "per_channel": "true", "execution": "native"}
    fp32 = _run(client, experiment, parent, "onnx-fp32", 1, quantized="false")
    _log(client, fp32, _metrics("fp32", 0.8719, 320_000, 900.0), {"backend": "onnx"}, AVX2.tags(), "FINISHED")
    accuracies = {  # (algo, ADC rule, learned on noisy chips) -> weight_noise -> accuracy per seed
        ("none", "mse", False): {0.0: (0.8221, 0.8180, 0.8250), 0.01: (0.70, 0.72, 0.74)},
        ("brecq", "learned", False): {0.0: (0.8364, 0.8401, 0.8330), 0.01: (0.75, 0.76, 0.77)},
        ("brecq", "learned", True): {0.01: (0.80, 0.81, 0.79)},
    }
    start = 10
    for (algo, rule, noisy), by_noise in accuracies.items():
        aware = {"algo.device_aware": "true"} if algo != "none" else {}
        aware |= {"algo.device_noise": "true"} if noisy else {}
        for noise, values in by_noise.items():
            for seed, accuracy in zip(("42", "0", "1"), values, strict=True):
                params = {
                    "dtype": "int8",
                    "calib": "minmax",
                    "backend": "onnx",
                    "data.seed": seed,
                    "algo": algo,
                }
                params |= {"device.adc_range": rule, "device.weight_noise": str(noise)}
                params |= {key: "True" for key in aware}
                run = _run(
                    client,
                    experiment,
                    parent,
                    f"run{start}",
                    start,
                    quantized="true",
                    config_hash=f"h{start}",
                )
                metrics = _metrics("q", 0.8695, 110_000, 4000.0) | {
                    "accuracy_device": accuracy,
                    "accuracy_device_std": 0.01 if noise else 0.0,
                    "accuracy_device_ci_low": accuracy - 0.007,
                    "accuracy_device_ci_high": accuracy + 0.007,
                    "device_differing_predictions": 900.0,
                }
                device = device_tags(rows=128, adc_bits=4, adc_range=rule, weight_noise=noise)
                _log(client, run, metrics, params, base | {"algo": algo} | aware | device, "FINISHED")
                start += 1
    client.set_terminated(parent, "FINISHED")
    text = (report.write_report(parent, tracking_uri=client.tracking_uri).parent / "report.md").read_text()
    spread = text.split("Over calibration samples", 1)[1]
    assert "| onnx int8 minmax per-channel @cim-r128-adc4 | 3 | 82.17 ± 0.35 | 81.80-82.50 |" in spread
    learned = "| onnx int8 minmax per-channel brecq device-aware @cim-r128-adc4-learned | 3 | 83.65 ± 0.36 |"
    assert learned in spread
    noise = text.split("against `weight_noise`:", 1)[1]
    assert "| onnx int8 minmax per-channel, adc_range=mse | 82.17 | 72.00 |" in noise
    assert "| onnx int8 minmax per-channel brecq device-aware, adc_range=learned | 83.65 | 76.00 |" in noise
    assert "on noisy chips" in spread  # a single noise level: a point, not a curve, for the noisy learning
