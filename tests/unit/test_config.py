"""Config composition (Hydra groups, typed schema) and the errors a user gets for bad choices."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

import resnet8ptq.config  # noqa: F401  (registers base_config)
from resnet8ptq.backends.base import Backend
from resnet8ptq.config import quant_spec
from resnet8ptq.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"


def composed(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_defaults() -> None:
    cfg = composed()
    assert cfg.backend == {"_target_": "resnet8ptq.backends.onnx.backend.OnnxRuntimeBackend", "native": True}
    assert (cfg.dtype.activation, cfg.dtype.weight) == ("int8", "int8")
    assert cfg.calib.method == "minmax"
    assert cfg.per_channel is False
    assert (cfg.data.calib_per_class, cfg.data.seed) == (100, 42)
    assert cfg.mlflow.tracking_uri is None
    assert cfg.hydra.run.dir.startswith("runs/") and cfg.hydra.sweep.dir.startswith("runs/")
    assert cfg.hydra.job.chdir is False


@pytest.mark.parametrize(
    ("choice", "activation", "weight"),
    [("int8", "int8", "int8"), ("uint8", "uint8", "uint8"), ("u8s8", "uint8", "int8")],
)
def test_dtype_group(choice: str, activation: str, weight: str) -> None:
    spec = quant_spec(composed(f"dtype={choice}"))
    assert spec.dtype.pair == (activation, weight)


@pytest.mark.parametrize("choice", ["minmax", "entropy", "percentile", "mse"])
def test_calib_group(choice: str) -> None:
    spec = quant_spec(composed(f"calib={choice}", "per_channel=true"))
    assert spec.calib.method == choice
    assert spec.per_channel is True
    if choice == "entropy":  # a real KL search, not ORT's default that equals minmax
        assert spec.calib.num_quantized_bins < spec.calib.num_bins


@pytest.mark.parametrize("name", sorted(path.stem for path in (CONF / "backend").glob("*.yaml")))
def test_backend_group_instantiates_its_typed_config(name: str) -> None:
    """Each `backend` choice is a package with a typed schema, and its `_target_` a Backend of that name."""
    cfg = composed(f"backend={name}")
    assert OmegaConf.get_type(cfg.backend).__module__ == f"resnet8ptq.backends.{name}.config"
    backend_class = get_class(cfg.backend._target_)
    assert issubclass(backend_class, Backend) and name == backend_class.NAME
    backend = instantiate(cfg.backend, threads=1)
    assert (backend.native, backend.threads) == (True, 1)


def test_backend_options_are_typed() -> None:
    assert composed("backend=torch", "backend.native=false").backend.native is False
    with pytest.raises(ConfigCompositionException, match=r"backend\.compile"):
        composed("backend=onnx", "backend.compile=true")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("per_channel=maybe", "is not a valid bool"),
        ("reduce_range=sometimes", "is not a valid bool"),
        ("data.calib_per_class=lots", "to Integer"),
        ("native_tolerance_points=small", "to Float"),
    ],
)
def test_wrong_types_are_rejected(override: str, expected: str) -> None:
    with pytest.raises(ConfigCompositionException, match=f"Error merging override {override}") as info:
        composed(override)
    assert expected in str(info.value.__cause__)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("calib.num_quantized_bins=2048", "num_quantized_bins"),
        ("calib.percentile=101", "percentile"),
        ("dtype.activation=int4", "dtype.activation"),
        ("native_tolerance_points=-0.1", "native_tolerance_points"),
        ("threads=-3", "threads=-3"),
        ("threads=0", "threads=0"),
        ("dtype.first_last_bits=9", r"first_last_bits=9: .* expected null or 8..8"),
    ],
)
def test_bad_values_are_rejected(override: str, message: str) -> None:
    group = "calib=percentile" if "percentile" in override else "calib=entropy"
    with pytest.raises(ValueError, match=message):
        quant_spec(composed(group, override))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.steps=[rounding]"], r"algo.steps: unknown \['rounding'\]"),
        (["algo.steps=[bias_correction,cle]"], "in the order cle, adaround, brecq, qdrop, bias_correction"),
        (["algo=adaround", "algo.adaround_iterations=0"], "expected positive numbers"),
        (["algo=brecq", "algo.brecq_batch_size=0"], "algo.brecq_batch_size: expected positive"),
        (["algo=qdrop", "algo.qdrop_drop=1.0"], "algo.qdrop_drop: expected a probability"),
        (["target.max_drop_points=0.5", "layer_analysis=false"], "with layer_analysis=false"),
        (  # cells sized for the 4-bit layers cannot hold the first and last layers' 8-bit weights
            ["device=cim", "device.bits_per_cell=3", "dtype.weight_bits=4", "dtype.first_last_bits=8"],
            "8-bit int8 weights need 7",
        ),
        # device-aware learning (algo.device_aware) and the learned ADC range
        (["algo=cle", "algo.device_aware=true"], r"none of them learns against a device; use one of brecq"),
        (["algo=brecq", "algo.device_aware=true"], "with device=none: the learning needs the crossbar"),
        (["algo=brecq", "algo.device_aware=true", "device=integer"], "with device=integer"),
        (["algo=brecq", "algo.device_aware=true", "device=cim"], r"device.adc_bits=null \(an ideal ADC"),
        (
            ["algo=qdrop", "algo.device_aware=true", "device=cim", "device.adc_bits=4", "device.dac_bits=2"],
            "device.dac_bits=2 device.dac_range=full",
        ),
        (
            [
                "algo=brecq",
                "algo.device_aware=true",
                "device=cim",
                "device.adc_bits=4",
                "device.cells_per_weight=2",
                "device.bits_per_cell=4",
            ],
            "device.cells_per_weight=2",
        ),
        (
            ["algo=brecq", "algo.device_aware=true", "device=cim", "device.adc_bits=4", "dtype=uint8"],
            "with dtype.weight=uint8: asymmetric weight grids",
        ),
        (
            ["algo=brecq", "device=cim", "device.adc_bits=4", "device.adc_range=learned"],
            "device.adc_range=learned takes the ADC steps that device-aware learning learned",
        ),
        (["algo=brecq", "algo.device_noise=true"], "algo.device_noise=true learns on noisy chips"),
        (
            [
                "algo=brecq",
                "algo.device_aware=true",
                "algo.device_noise=true",
                "device=cim",
                "device.adc_bits=4",
            ],
            "algo.device_noise=true draws the chip's cell effects while learning, and this crossbar has none",
        ),
        (  # a read's noise is not drawn while learning
            [
                "algo=brecq",
                "algo.device_aware=true",
                "algo.device_noise=true",
                "device=cim",
                "device.adc_bits=4",
                "device.read_noise=0.01",
            ],
            "this crossbar has none",
        ),
    ],
)
def test_bad_combinations_are_refused_by_name(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        quant_spec(composed(*overrides))


def test_algo_group_choices() -> None:
    assert composed("algo=cle_bias_correction").algo.steps == ["cle", "bias_correction"]
    assert composed().algo.steps == []


@pytest.mark.parametrize(("override", "affinity", "expected"), [(None, 6, 6), ("threads=3", 6, 3)])
def test_threads_follow_the_cpu_affinity(
    monkeypatch: pytest.MonkeyPatch, override: str | None, affinity: int, expected: int
) -> None:
    """`threads=null`: the cores this process may use (taskset, SLURM), not the machine's, given to every
    library explicitly (ONNX Runtime's own default ignores the affinity)."""
    from resnet8ptq.resolve import threads_per_run

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    cfg = composed(*([override] if override else []))
    assert threads_per_run(cfg) == expected
    assert instantiate(cfg.backend).threads == affinity  # a backend built without a count takes them all


def test_a_sweep_job_directory_name_fits_a_file_system() -> None:
    """Hydra names a job's directory after its overrides: a long list would exceed 255 bytes (OSError), and a
    layer name's slash would nest directories."""
    from resnet8ptq.config import job_dirname

    assert (
        job_dirname("backend=onnx,layer_bits.activation_1/Relu=6")
        == "backend=onnx,layer_bits.activation_1_Relu=6"
    )
    long, other = (
        "target.weight_choices=[2,4,8]," * 20 + "backend=onnx",
        "target.weight_choices=[2,4,8]," * 20 + "b=t",
    )
    assert len(job_dirname(long).encode()) <= 120
    assert job_dirname(long) != job_dirname(other)
