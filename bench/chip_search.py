"""How well a multi-objective sampler finds a measured grid's frontier in a given number of trials, over many
seeds (issue 61: "the search finds every frontier point of the grid in at most half its runs"). Outside CI.

A sampler sees only the objective values of the designs it proposes, and a design's values are what its
device run logged (a search's repeated design reuses that run: resnet8ptq/search/), so replaying Optuna's
samplers against the runs of a grid sweep gives the trials a real search would make, seed for seed, in
seconds instead of one device run a trial. The grid: the device runs of one MLflow experiment that
logged both objectives, one per design (``--params``); the Pareto front: the report's
(resnet8ptq/report/analysis.py). Printed per sampler and trial budget, over ``--seeds`` seeds: the frontier
designs found (mean), the seeds that found all of them, the distinct designs proposed (a repeat costs no run),
and ``--seed``'s own trials.

Usage (the grid of docs/chip_cost.md, then this):
    .venv/bin/python run.py -m backend=onnx dtype=int8 per_channel=true device=cim \
        device.rows=64,128,256 device.adc_bits=4,5,6,8
    .venv/bin/python bench/chip_search.py [--tracking-uri sqlite:///mlflow.db] [--experiment resnet8ptq] \
        [--trials 6,12] [--seeds 50] [--seed 42]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resnet8ptq.report.analysis import pareto_mask
from resnet8ptq.search.objectives import directions

Design = tuple[str, ...]


def measured_grid(
    uri: str, experiment: str, params: list[str], objectives: list[str]
) -> dict[Design, list[float]]:
    """Each design's objective values, from the finished runs of ``experiment`` that set every parameter
    (not null: the integer device has no rows) and logged every objective
        (ValueError if one design was run twice with different values: the grid is then not one sweep)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"{uri} has no experiment {experiment!r}")
    grid: dict[Design, list[float]] = {}
    for run in client.search_runs([found.experiment_id], "attributes.status = 'FINISHED'", max_results=5000):
        design = tuple(run.data.params.get(name, "") for name in params)
        if {"", "None"} & set(design) or any(name not in run.data.metrics for name in objectives):
            continue
        values = [run.data.metrics[name] for name in objectives]
        if grid.setdefault(design, values) != values:
            raise ValueError(
                f"design {design} has two runs with different {objectives}: {grid[design]} vs {values}"
            )
    if not grid:
        raise ValueError(f"no finished run in {experiment!r} logged {params} and {objectives}")
    return grid


def frontier(grid: dict[Design, list[float]], objectives: list[str]) -> set[Design]:
    """The designs on the grid's Pareto front."""
    designs = list(grid)
    maximize = [direction == "maximize" for direction in directions(objectives)]
    mask = pareto_mask(np.array([grid[d] for d in designs], dtype=float), maximize)
    return {design for design, on in zip(designs, mask, strict=True) if on}


def replay(
    sampler, grid: dict[Design, list[float]], params: list[str], objectives: list[str], trials: int
) -> list[Design]:
    """The designs ``sampler`` proposes in ``trials`` trials over the grid's choices, told their values."""
    import optuna

    choices = {name: sorted({design[i] for design in grid}, key=_order) for i, name in enumerate(params)}
    study = optuna.create_study(directions=directions(objectives), sampler=sampler)
    proposed: list[Design] = []

    def objective(trial) -> list[float]:
        design = tuple(trial.suggest_categorical(name, choices[name]) for name in params)
        proposed.append(design)
        if design not in grid:
            raise optuna.TrialPruned()  # a design the grid did not run: counted, not scored
        return grid[design]

    study.optimize(objective, n_trials=trials)
    return proposed


def _order(value: str) -> tuple:
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def samplers() -> dict[str, Callable[[int], object]]:
    """The samplers compared: NSGA-II as conf/experiment/chip_search.yaml sets it, and two others of Optuna
    2.10 (the version hydra-optuna-sweeper 1.3.0 allows)."""
    import optuna

    return {
        "NSGA-II (population 4)": lambda seed: optuna.samplers.NSGAIISampler(seed=seed, population_size=4),
        "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
        "MOTPE (3 random first)": lambda seed: optuna.samplers.MOTPESampler(seed=seed, n_startup_trials=3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--experiment", default="resnet8ptq")
    parser.add_argument("--params", default="device.rows,device.adc_bits")
    parser.add_argument("--objectives", default="accuracy_device,device_energy_uj")
    parser.add_argument("--trials", default="6,12", help="trial budgets, comma-separated")
    parser.add_argument("--seeds", type=int, default=50, help="seeds 0..N-1 per sampler and budget")
    parser.add_argument("--seed", type=int, default=42, help="the seed whose own trials are shown")
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")  # Optuna 2.10 calls MOTPE and NSGA-II experimental
    params, objectives = args.params.split(","), args.objectives.split(",")
    grid = measured_grid(args.tracking_uri, args.experiment, params, objectives)
    front = frontier(grid, objectives)
    print(f"{len(grid)} designs ({', '.join(params)}), {len(front)} on the front of {', '.join(objectives)}:")
    print("  " + "; ".join("-".join(d) for d in sorted(front, key=lambda d: [_order(v) for v in d])))
    header = f"{'sampler':24s} {'trials':>6s} {'front found (mean)':>19s} {'all found':>10s} {'distinct':>9s}"
    print(f"{header}  seed {args.seed}")
    for name, make in samplers().items():
        for trials in [int(n) for n in args.trials.split(",")]:
            found, distinct, complete = [], [], 0
            for seed in range(args.seeds):
                proposed = set(replay(make(seed), grid, params, objectives, trials))
                found.append(len(front & proposed))
                distinct.append(len(proposed))
                complete += front <= proposed
            own = set(replay(make(args.seed), grid, params, objectives, trials))
            print(
                f"{name:24s} {trials:6d} {statistics.mean(found):12.2f} of {len(front)} "
                f"{complete:5d}/{args.seeds:<4d} {statistics.mean(distinct):9.1f}  "
                f"found {len(front & own)}, {len(own)} distinct"
            )


if __name__ == "__main__":
    main()
