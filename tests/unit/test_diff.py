"""`python -m resnet8ptq.diff`: two runs in two stores, one calibration range nudged, is named as the first
difference, down to the tensor; what follows from it (model, predictions) is counted; paths do not count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from resnet8ptq import diff
from resnet8ptq.digests import predictions_digest, ranges_digest
from resnet8ptq.spec import TensorRange

LABELS = np.arange(100) % 10


def logged_run(
    tmp_path: Path, store: str, ranges: list[TensorRange], predicted: np.ndarray, data: str | None = None
) -> tuple[str, str]:
    """A run as a quantized run records it: settings, versions, hardware, digests and the two tables."""
    uri = f"sqlite:///{tmp_path / store}.db"
    client = MlflowClient(uri)
    found = client.get_experiment_by_name("resnet8ptq")
    experiment = (
        found.experiment_id
        if found
        else client.create_experiment("resnet8ptq", artifact_location=str(tmp_path / f"{store}-artifacts"))
    )
    run = client.create_run(experiment, run_name="onnx-int8")
    run_id = run.info.run_id
    for key, value in {"dtype": "int8", "calib": "minmax", "cache_dir": f"/home/{store}/.cache"}.items():
        client.log_param(run_id, key, value)
    tags = {
        "version.onnxruntime": "1.23.2",
        "hardware.cpu": "Intel Xeon",
        "digest.calibration_ranges": ranges_digest(ranges),
        "digest.model": "model-" + ranges_digest(ranges)[:6],
        "digest.predictions": predictions_digest(predicted),
        **({"data": data} if data else {}),
    }
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    folder = tmp_path / store / run_id
    folder.mkdir(parents=True)
    pd.DataFrame([vars(r) for r in ranges]).to_csv(folder / "calibration_ranges.csv", index=False)
    pd.DataFrame({"label": LABELS, "predicted": predicted}).rename_axis("image").to_csv(
        folder / "predictions.csv"
    )
    client.log_artifact(run_id, str(folder / "calibration_ranges.csv"), "calibration")
    client.log_artifact(run_id, str(folder / "predictions.csv"), "evaluation")
    client.set_terminated(run_id)
    return uri, run_id


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[str, str], ...]:
    tmp_path = tmp_path_factory.mktemp("stores")
    ranges = [
        TensorRange("input", 0.0, 255.0),
        TensorRange("conv1", -3.5, 6.25),
        TensorRange("conv2", 0.0, 4.0),
    ]
    nudged = [ranges[0], TensorRange("conv1", -3.5, 6.3), ranges[2]]
    predicted = LABELS.copy()
    moved = predicted.copy()
    moved[[3, 13, 40]] = [4, 4, 1]  # three images of classes cat, cat, airplane now wrong
    same = logged_run(tmp_path, "here", ranges, predicted)
    twin = logged_run(tmp_path, "twin", ranges, predicted)
    other = logged_run(tmp_path, "there", nudged, moved)
    logged_run(tmp_path, "here", nudged, moved)  # a second run in the first store, for the explorer
    return same, twin, other


def test_a_nudged_range_is_the_first_difference(two_stores, capsys: pytest.CaptureFixture) -> None:
    (uri_a, run_a), _, (uri_b, run_b) = two_stores
    assert (
        diff.main([run_a, run_b, "--tracking-uri", uri_a, "--tracking-uri-b", uri_b]) == diff.EXIT_DIFFERENT
    )
    out = capsys.readouterr().out
    first, verdict = out.splitlines()[-2:]
    assert verdict == "verdict: different model"
    assert first.startswith("first difference: calibration ranges")
    assert (
        "1 of 3 tensors' ranges differ; most: conv1 [-3.5, 6.25] vs [-3.5, 6.3] (0.0051 of its span)" in first
    )
    assert "3 of 100 images predicted differently (most in cat 2, airplane 1); correct 100 vs 97" in out
    assert "configuration        same" in out  # the cache folder differs, and decides nothing


def test_two_stores_with_the_same_run_show_no_difference(two_stores, capsys: pytest.CaptureFixture) -> None:
    (uri_a, run_a), (uri_b, run_b), _ = two_stores
    assert diff.main([run_a, run_b, "--tracking-uri", uri_a, "--tracking-uri-b", uri_b]) == diff.EXIT_SAME
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "no difference",
        "verdict: same model, same predictions",
    ]


def stages_differing(*names: str) -> list[tuple[str, str | None]]:
    """Every stage, with a difference in ``names``."""
    return [(stage.name, "differs" if stage.name in names else None) for stage in diff.STAGES]


@pytest.mark.parametrize(
    ("differing", "expected"),
    [
        (("hardware", "predictions"), "same model, different reference pass, on other hardware"),
        (("hardware",), "same model, same predictions, on other hardware"),
        (("hardware", "calibration ranges", "model", "predictions"), "different model, on other hardware"),
        (("model", "integer form", "device predictions"), "different model"),
        (
            ("library versions", "device predictions"),
            "same model, different device predictions, with other library versions",
        ),
        (("integer form", "predictions"), "same model, different integer form, different reference pass"),
        (("configuration", "model"), "different configuration"),
        (("calibration sample", "calibration ranges"), "different calibration sample"),
    ],
)
def test_the_verdict_says_what_the_differences_mean(differing: tuple[str, ...], expected: str) -> None:
    assert diff.verdict(stages_differing(*differing)) == expected


def test_a_missing_run_or_store_is_named(two_stores, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (uri_a, run_a), _, _ = two_stores
    assert diff.main([run_a, "0" * 32, "--tracking-uri", uri_a]) == diff.EXIT_MISSING
    assert f"No run {'0' * 32} in {uri_a}" in capsys.readouterr().err
    assert (
        diff.main([run_a, run_a, "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == diff.EXIT_MISSING
    )
    assert "No MLflow store at" in capsys.readouterr().err


def test_the_explorer_shows_where_two_runs_of_one_store_part(two_stores) -> None:
    """The explorer's two-runs view (``where_runs_part``) lists the same stages as the CLI."""
    from resnet8ptq.explore import where_runs_part

    (uri, run_a), _, _ = two_stores
    client = MlflowClient(uri)
    (run_b,) = [r.info.run_id for r in client.search_runs(["1"]) if r.info.run_id != run_a]
    table = where_runs_part(uri, run_a, run_b)
    assert list(table["stage"]) == [stage.name for stage in diff.STAGES]
    parted = table[table["difference"] != "same"]
    assert parted.iloc[0]["stage"] == "calibration ranges"
    assert "conv1 [-3.5, 6.25] vs [-3.5, 6.3]" in parted.iloc[0]["difference"]
    assert (where_runs_part(uri, run_a, run_a)["difference"] == "same").all()


def test_other_datas_classes_are_named_by_their_label(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A user's data (data=npz) has no CIFAR-10 names: the images that moved are counted by label."""
    ranges = [TensorRange("input", 0.0, 1.0)]
    moved = LABELS.copy()
    moved[[3, 13, 40]] = [4, 4, 1]
    uri_a, run_a = logged_run(tmp_path, "a", ranges, LABELS.copy(), data="npz")
    uri_b, run_b = logged_run(tmp_path, "b", ranges, moved, data="npz")
    diff.main([run_a, run_b, "--tracking-uri", uri_a, "--tracking-uri-b", uri_b])
    assert "3 of 100 images predicted differently (most in class 3 2, class 0 1)" in capsys.readouterr().out
