"""What `config_hash` covers: the settings that decide a run's result, the model and the library versions;
not paths, the tracking store or the report settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import resnet8ptq.config  # noqa: F401  (registers base_config)
from resnet8ptq.tracking.identity import config_hash, run_params

REPO = Path(__file__).resolve().parents[2]
IDENTITY = {"model": "0123456789abcdef", "version.onnxruntime": "1.31.0"}


def params(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return run_params(compose("config", overrides=list(overrides)))


@pytest.mark.parametrize(
    "override",
    [
        "backend=torch",
        "dtype=uint8",
        "dtype=u8s8",
        "dtype=a16w8",
        "dtype.weight_bits=4",
        "dtype.activation_bits=6",
        "calib=entropy",
        "calib.symmetric=true",
        "calib.batch_size=50",
        "per_channel=true",
        "reduce_range=true",
        "native_tolerance_points=0.1",
        "backend.native=false",
        "data.calib_per_class=10",
        "data.seed=1",
        "raised_layers=[activation_6_1/Relu]",  # mixed precision: each step is its own result
        "layer_analysis=false",  # what the run holds: a lean run is not reused by a sweep that wants it
        "mlflow.log_models=false",
        "algo.device_aware=true",
        "algo.device_noise=true",
    ],
)
def test_config_hash_changes_with_what_changes_the_result(override: str) -> None:
    assert config_hash(params(override), IDENTITY) != config_hash(params(), IDENTITY)


@pytest.mark.parametrize(
    "override",
    [
        "data.root=/elsewhere",
        "data.download=false",
        "model.path=/elsewhere/model.h5",  # its sha256 is what counts (identity)
        "model.sha256=null",
        "cache_dir=/elsewhere",
        "mlflow.tracking_uri=http://tracking:5000",
        "mlflow.experiment=other",
        "rerun=true",
        "threads=1",
        "report.enabled=false",
        "search.objectives=[accuracy,model_size_bytes]",
        "target.max_drop_points=0.1",
        "target.layers_per_step=4",
        "algo.reuse=false",  # the same output, computed again
    ],
)
def test_config_hash_ignores_what_does_not(override: str) -> None:
    assert config_hash(params(override), IDENTITY) == config_hash(params(), IDENTITY)


def test_config_hash_counts_the_content_of_a_group_not_its_label() -> None:
    spelled_out = params("dtype=int8", "dtype.activation=uint8", "dtype.weight=int8")
    assert config_hash(spelled_out, IDENTITY) == config_hash(params("dtype=u8s8"), IDENTITY)


@pytest.mark.parametrize("changed", [{"model": "fedcba9876543210"}, {"version.onnxruntime": "1.32.0"}])
def test_config_hash_changes_with_the_model_and_the_libraries(changed: dict) -> None:
    assert config_hash(params(), IDENTITY | changed) != config_hash(params(), IDENTITY)


def test_config_hash_of_8_bit_runs_is_the_one_before_bit_widths_existed() -> None:
    """Runs tracked before `dtype.*_bits` existed are found again by a resumed sweep."""
    before = {k: v for k, v in params().items() if not k.endswith("_bits")}
    assert config_hash(before, IDENTITY) == config_hash(params(), IDENTITY)


def test_config_hash_of_runs_that_log_everything_is_the_one_before_the_switches_existed() -> None:
    before = {k: v for k, v in params().items() if k not in ("layer_analysis", "mlflow.log_models")}
    assert config_hash(before, IDENTITY) == config_hash(params(), IDENTITY)


def test_config_hash_of_runs_without_raised_layers_is_the_one_before_mixed_precision_existed() -> None:
    before = {
        k: v for k, v in params().items() if k != "raised_layers" and not k.startswith(("search.", "target."))
    }
    assert config_hash(before, IDENTITY) == config_hash(params(), IDENTITY)
    one, two = params("raised_layers=[conv2d_1]"), params("raised_layers=[conv2d_1,conv2d_1_2]")
    assert len({config_hash(one, IDENTITY), config_hash(two, IDENTITY), config_hash(params(), IDENTITY)}) == 3


def test_device_aware_learning_quantizes_per_crossbar_it_learns_against() -> None:
    """A device sweep shares one quantization (the key without the device settings), unless the
    quantization learned against the device: then each crossbar the learning sees is its own."""
    from resnet8ptq.algorithms import AlgoConfig
    from resnet8ptq.resolve import learned_on, without_device

    def key(algo: AlgoConfig, *overrides: str) -> str:
        return config_hash(without_device(params("device=cim", *overrides), learned_on(algo)), IDENTITY)

    plain, aware = AlgoConfig(["brecq"]), AlgoConfig(["brecq"], device_aware=True)
    four, five = "device.adc_bits=4", "device.adc_bits=5"
    assert key(plain, four) == key(plain, five)
    assert key(aware, four) != key(aware, five)
    assert key(aware, four, "device.adc_range=learned") == key(aware, four)  # the evaluation's rule
    assert key(aware, four, "device.weight_noise=0.1") == key(aware, four)  # not seen while learning
    noisy = AlgoConfig(["brecq"], device_aware=True, device_noise=True)  # unless it learns on noisy chips
    assert key(noisy, four, "device.weight_noise=0.1") != key(noisy, four, "device.weight_noise=0.2")
    assert key(noisy, four, "device.weight_noise=0.1", "device.read_noise=0.1") == key(
        noisy, four, "device.weight_noise=0.1"
    )  # a read's effects are not drawn while learning


def test_the_chip_cost_settings_count_for_device_runs_only() -> None:
    """What a chip costs is part of a device run's result (a run costed at another node is not reused), of no
    other run's: runs without a device keep the config_hash they had before the `components` group came.
    Whether an uncovered design is refused or run uncosted (`components.required`) changes nothing logged."""
    integer = params("device=integer")
    assert config_hash(params("device=integer", "components.tech_node_nm=45"), IDENTITY) != config_hash(
        integer, IDENTITY
    )
    assert config_hash(params("device=integer", "components=none"), IDENTITY) != config_hash(
        integer, IDENTITY
    )
    assert config_hash(params("device=integer", "components.required=true"), IDENTITY) == config_hash(
        integer, IDENTITY
    )
    assert config_hash(params("components.tech_node_nm=45"), IDENTITY) == config_hash(params(), IDENTITY)
    before = {k: v for k, v in params().items() if k != "components" and not k.startswith("components.")}
    assert config_hash(before, IDENTITY) == config_hash(params(), IDENTITY)
