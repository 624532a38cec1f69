"""Small tracking helpers: MLflow filters that values cannot break, content digests, the UI's runs page."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq.tracking.models import content_digest
from resnet8ptq.tracking.search import equals, where
from resnet8ptq.tracking.store import runs_page

REPO = Path(__file__).resolve().parents[2]


def test_filter_values_are_quoted_with_the_quote_they_lack() -> None:
    assert equals("tags.config_hash", "abc") == "tags.config_hash = 'abc'"
    assert equals("tags.mlflow.parentRunId", "r1") == "tags.`mlflow.parentRunId` = 'r1'"
    assert equals("tags.error", "it's") == 'tags.error = "it\'s"'
    with pytest.raises(ValueError, match="both kinds of quotes"):
        equals("tags.error", 'it\'s "odd"')
    assert where({"tags.a": "1", "attributes.status": "FINISHED"}) == (
        "tags.a = '1' and attributes.status = 'FINISHED'"
    )


def test_content_digest_follows_the_data() -> None:
    images = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    labels = np.array([0, 1])
    assert content_digest(images, labels) == content_digest(images.copy(), labels.copy())
    assert content_digest(images, labels) != content_digest(images, labels[::-1])
    assert len(content_digest(images)) == 16


def test_runs_page_opens_the_model_training_view() -> None:
    assert runs_page("7", "http://tracking:5000/") == (
        "http://tracking:5000/#/experiments/7/runs?workflowType=machine_learning"
    )
    assert runs_page("1", "sqlite:///mlflow.db").startswith("http://127.0.0.1:5000/#/experiments/1/runs")


def test_model_lands_in_its_runs_experiment_with_its_params(tmp_path, monkeypatch) -> None:
    import mlflow
    from onnx import TensorProto, helper

    from resnet8ptq.backends.base import MlflowFlavor
    from resnet8ptq.tracking.models import log_model, model_name

    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        client = mlflow.MlflowClient()
        home = client.create_experiment("home")
        run = client.create_run(home)
        client.log_param(run.info.run_id, "dtype", "int8")
        client.log_metric(run.info.run_id, "accuracy", 0.87)
        mlflow.set_experiment("elsewhere")  # the process's active experiment is not the run's
        graph = helper.make_graph(
            [helper.make_node("Flatten", ["x"], ["y"])],
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32, 32, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3072])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        how = MlflowFlavor(mlflow.onnx, {"onnx_model": model, "save_as_external_data": False}, ["onnx"])
        # A run name MLflow refuses as a model name (a device label with a percentile): its dots become _.
        uri = log_model(run.info.run_id, "tiny-cim-adc4-p99.99", how, np.zeros((1, 32, 32, 3), np.float32))
        logged = client.get_logged_model(uri.removeprefix("models:/"))
        assert (
            logged.name == "tiny-cim-adc4-p99_99"
            and model_name("onnx-int8-int8-minmax") == "onnx-int8-int8-minmax"
        )
        assert logged.experiment_id == home
        assert logged.source_run_id == run.info.run_id
        assert logged.params == {"dtype": "int8"}
        assert [(m.key, m.value) for m in logged.metrics] == [("accuracy", 0.87)]
        assert mlflow.onnx.load_model(uri).graph.name == "tiny"
    finally:
        mlflow.set_tracking_uri(None)


def test_a_model_logged_in_a_uv_project_states_its_own_requirements(tmp_path, monkeypatch) -> None:
    """Run from this repository (a uv project), MLflow would copy uv.lock and pyproject.toml into every model
    and export the project's requirements instead: the package turns that off."""
    import mlflow
    import mlflow.pyfunc

    from resnet8ptq.backends.base import MlflowFlavor
    from resnet8ptq.tracking.models import log_model

    for name in ("uv.lock", "pyproject.toml", ".python-version"):
        (tmp_path / name).write_text((REPO / name).read_text())
    monkeypatch.chdir(tmp_path)

    class Identity(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input):
            return model_input

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        client = mlflow.MlflowClient()
        run = client.create_run(client.create_experiment("uv"))
        how = MlflowFlavor(mlflow.pyfunc, {"python_model": Identity()}, ["numpy"])
        uri = log_model(run.info.run_id, "identity", how, np.zeros((1, 32, 32, 3), np.float32))
        files = set(os.listdir(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "model"))))
        assert "MLmodel" in files and not files & {"uv.lock", "pyproject.toml", ".python-version"}
        requirements = (tmp_path / "model" / "requirements.txt").read_text().split()
        assert requirements[1:] == ["numpy"]
    finally:
        mlflow.set_tracking_uri(None)


def _store(database) -> tuple[list, list]:
    """(migration revision, tables and indexes with every table's columns, experiments) of a SQLite store.
    Columns, not CREATE statements: MLflow's migrations write the same constraints in varying order."""
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(database)) as db:
        schema = db.execute("SELECT version_num FROM alembic_version").fetchall()
        for kind, name in sorted(db.execute("SELECT type, name FROM sqlite_master").fetchall()):
            schema.append((kind, name, db.execute(f'PRAGMA table_info("{name}")').fetchall()))
        experiments = db.execute(
            "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments ORDER BY 1"
        ).fetchall()
    return schema, experiments


def test_new_sqlite_store_is_what_mlflow_creates(tmp_path, monkeypatch) -> None:
    """A new store copied from the per-machine empty store has MLflow's schema at MLflow's revision and the
    experiments MLflow would have created, artifact locations included; an existing store is left alone."""
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from resnet8ptq.tracking.store import configure

    settings = OmegaConf.create({"tracking_uri": None, "experiment": "resnet8ptq"})
    made_by = {}
    for how in ("mlflow", "seeded", "seeded again"):
        workdir = tmp_path / how.replace(" ", "-")
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'mlflow.db'}")
        configure(settings, None if how == "mlflow" else tmp_path / "cache")
        made_by[how] = _store(workdir / "mlflow.db")
        MlflowClient().create_experiment("second")  # the store works on
    template = next((tmp_path / "cache").glob("mlflow-*-empty-store.db"))
    mlflow_schema, mlflow_experiments = made_by["mlflow"]
    for how in ("seeded", "seeded again"):
        schema, experiments = made_by[how]
        assert schema == mlflow_schema
        located = [(*e[:2], e[2].replace(how.replace(" ", "-"), "mlflow"), e[3]) for e in experiments]
        assert located == mlflow_experiments
    assert [e[:2] for e in mlflow_experiments] == [(0, "Default"), (1, "resnet8ptq")]
    monkeypatch.chdir(tmp_path / "seeded")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'seeded' / 'mlflow.db'}")
    before = template.stat().st_mtime_ns
    configure(settings, tmp_path / "cache")  # exists: neither copied over nor changed
    assert [e[1] for e in _store(tmp_path / "seeded" / "mlflow.db")[1]] == ["Default", "resnet8ptq", "second"]
    assert template.stat().st_mtime_ns == before


def test_unwritable_cache_dir_is_named_and_leaves_no_store(tmp_path, monkeypatch) -> None:
    from omegaconf import OmegaConf

    from resnet8ptq.errors import TrackingError
    from resnet8ptq.tracking.store import configure

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    settings = OmegaConf.create({"tracking_uri": None, "experiment": "resnet8ptq"})
    with pytest.raises(TrackingError, match=r"cache directory .*not-a-directory.*RESNET8PTQ_CACHE"):
        configure(settings, blocker / "cache")
    assert not (tmp_path / "mlflow.db").exists()


class _FlakyClient:
    """log_inputs fails ``failures`` times with ``error``, as MLflow's SQL store does when another run
    inserted the same dataset between its lookup and its insert, then records the call."""

    def __init__(self, failures: int, error: str) -> None:
        self.failures, self.error, self.calls, self.logged = failures, error, 0, []

    def __call__(self) -> _FlakyClient:
        return self

    def log_inputs(self, run_id: str, datasets: list) -> None:
        from mlflow.exceptions import MlflowException

        self.calls += 1
        if self.calls <= self.failures:
            raise MlflowException(self.error)
        self.logged.append((run_id, [d.dataset.name for d in datasets]))


def _datasets() -> dict:
    from resnet8ptq.tracking.models import numpy_dataset

    images, labels = np.zeros((2, 32, 32, 3), np.uint8), np.array([0, 1])
    return {"evaluation": numpy_dataset("cifar10-test", images, labels, "/data", "d1")}


@pytest.mark.parametrize(
    "error",
    [
        "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name",
        '(psycopg2.errors.UniqueViolation) duplicate key value violates unique constraint "dataset_pk"',
    ],
)
def test_a_dataset_logged_by_another_run_meanwhile_is_logged_again(monkeypatch, error: str) -> None:
    from resnet8ptq.tracking import models

    client = _FlakyClient(1, error)
    monkeypatch.setattr(models, "MlflowClient", client)
    models.log_datasets("run1", _datasets())
    assert client.calls == 2 and client.logged == [("run1", ["cifar10-test"])]


def test_other_dataset_errors_and_a_lasting_duplicate_are_raised(monkeypatch) -> None:
    from mlflow.exceptions import MlflowException

    from resnet8ptq.tracking import models

    client = _FlakyClient(1, "Run 'run1' is not active")
    monkeypatch.setattr(models, "MlflowClient", client)
    with pytest.raises(MlflowException, match="not active"):
        models.log_datasets("run1", _datasets())
    assert client.calls == 1
    client = _FlakyClient(99, "UNIQUE constraint failed: datasets.name")
    monkeypatch.setattr(models, "MlflowClient", client)
    with pytest.raises(MlflowException, match="UNIQUE"):
        models.log_datasets("run1", _datasets())
    assert client.calls == models.INPUT_ATTEMPTS
