"""The conditional part of a search's space, for hydra-optuna-sweeper's ``custom_search_space`` hook: settings
that mean something for one calibration method only (the percentile, the KL histogram's bins) are tried only
in the trials that use that method, so equivalent configurations are not told apart by unused settings (their
config_hash is the same, and a finished one is reused)."""

from __future__ import annotations

from omegaconf import DictConfig


def calibration_parameters(cfg: DictConfig, trial) -> None:  # trial: optuna.trial.Trial
    """Suggest ``cfg.search.calib_params[<method>]`` for the trial's calibration method (the swept `calib`,
    else a fixed `calib=` override, else the configured one); a setting the command line sweeps or fixes is
    left to it."""
    method = trial.params.get("calib", trial.user_attrs.get("calib", cfg.calib.method))
    for key, choices in (cfg.search.calib_params.get(method) or {}).items():
        if key not in trial.params and key not in trial.user_attrs:
            trial.suggest_categorical(key, list(choices))
