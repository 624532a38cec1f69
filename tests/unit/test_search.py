"""Search settings and the search preset: objectives and their directions, the conditional calibration space,
the n-objective Pareto front."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import resnet8ptq.config  # noqa: F401  (registers base_config and the directions resolver)
from resnet8ptq.config import quant_spec
from resnet8ptq.errors import ConfigError
from resnet8ptq.report.analysis import pareto_front, pareto_mask
from resnet8ptq.search.objectives import directions, objective_values, sweep_tags, trial_tag
from resnet8ptq.search.space import calibration_parameters

REPO = Path(__file__).resolve().parents[2]


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_the_preset_derives_its_directions_from_the_objectives() -> None:
    single = composed("hydra/sweeper=search")
    assert single.hydra.sweeper._target_.endswith("OptunaSweeper")
    assert list(single.hydra.sweeper.direction) == ["maximize"]
    assert single.hydra.sweeper.sampler.seed == 42  # a re-run proposes the same trials, which resume
    assert single.hydra.sweeper.max_failure_rate == 0.0
    pair = composed("hydra/sweeper=search", "search.objectives=[accuracy,model_size_bytes]")
    assert list(pair.hydra.sweeper.direction) == ["maximize", "minimize"]
    space = dict(pair.hydra.sweeper.params)
    assert {"dtype", "dtype.weight_bits", "per_channel", "calib", "algo"} <= set(space)
    tags = sweep_tags(pair.hydra.sweeper, ["accuracy", "model_size_bytes"])
    assert tags["search.directions"] == "maximize,minimize" and tags["search.sampler"] == "TPESampler"
    assert "calib=choice(minmax,entropy,percentile)" in tags["search.space"]


@pytest.mark.parametrize("objectives", [[], ["accuracy", "accuracy"], ["accuracy", "speed"]])
def test_bad_objectives_are_refused_with_the_valid_names(objectives: list[str]) -> None:
    with pytest.raises(ValueError, match="expected distinct names among accuracy, model_size_bytes"):
        directions(objectives)
    cfg = composed(f"search.objectives=[{','.join(objectives)}]")
    with pytest.raises(ConfigError, match=r"search\.objectives"):
        quant_spec(cfg)


def test_objective_values_come_from_the_logged_metrics_in_order() -> None:
    metrics = {"accuracy": 0.8654, "model_size_bytes": 110_000.0, "throughput_img_s": 2000.0}
    assert objective_values(metrics, ["model_size_bytes", "accuracy"], "r1") == [110_000.0, 0.8654]
    with pytest.raises(ValueError, match="Run r1 logged no latency_ms_b1"):
        objective_values(metrics, ["latency_ms_b1"], "r1")
    assert trial_tag(7) == "search.trial.0007"


def _trial(calib: str | None = None, fixed: str | None = None) -> optuna.trial.Trial:
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    if calib:
        trial.suggest_categorical("calib", [calib])
    if fixed:
        trial.set_user_attr("calib", fixed)
    return trial


def test_calibration_parameters_are_searched_only_with_their_method() -> None:
    cfg = composed()
    percentile = _trial("percentile")
    calibration_parameters(cfg, percentile)
    assert percentile.params["calib.percentile"] in (99.9, 99.99, 99.999, 99.9999)
    entropy = _trial(fixed="entropy")  # a fixed calib=entropy on the command line
    calibration_parameters(cfg, entropy)
    assert entropy.params["calib.num_quantized_bins"] in (128, 256, 512)
    minmax = _trial("minmax")
    calibration_parameters(cfg, minmax)
    assert set(minmax.params) == {"calib"}  # nothing that minmax would ignore (it would split config_hash)
    default = _trial()  # no calib dimension: the configured method (minmax)
    calibration_parameters(cfg, default)
    assert default.params == {}


def test_pareto_mask_over_any_number_of_objectives() -> None:
    # accuracy (max), size (min), throughput (max)
    values = np.array([[0.87, 100, 10], [0.86, 100, 10], [0.85, 90, 10], [0.85, 90, 20], [0.87, 100, 10]])
    assert pareto_mask(values, [True, False, True]).tolist() == [True, False, False, True, True]
    assert pareto_mask(values[:, :1], [True]).tolist() == [True, False, False, False, True]
    # the 2-objective front of the report's trade-off plots is the same rule
    x, accuracy = values[:, 1], values[:, 0]
    assert (
        pareto_front(x, accuracy, minimize_x=True).tolist()
        == pareto_mask(values[:, :2], [True, False]).tolist()
    )


def test_target_settings_are_validated() -> None:
    for override, message in [
        ("target.max_drop_points=-0.1", "expected points >= 0"),
        ("target.layers_per_step=0", "expected a positive number"),
        ("target.max_steps=0", "expected a positive number, or null"),
    ]:
        with pytest.raises(ConfigError, match=message):
            quant_spec(composed(override))
    target = OmegaConf.to_object(composed("target.max_drop_points=0.1").target)
    assert (target.max_drop_points, target.layers_per_step, target.max_steps) == (0.1, 1, None)
