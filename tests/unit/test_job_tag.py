"""A skipped job of a sweep is named on the sweep run by a tag MLflow takes, whatever its overrides hold."""

from __future__ import annotations

import pytest
from mlflow.utils.validation import _validate_tag_name

from resnet8ptq.app import job_tag


@pytest.mark.parametrize(
    "job",
    [
        "model=kws backend=tflite mlflow.tracking_uri=sqlite:////tmp/w/mlflow.db",  # '//' and a leading '/'
        "mcu/boards=[pico,samd21] data.path=../arrays/kws.npz",  # '..' segment
        "raised_layers=[conv2d_1/BiasAdd] x=/",
    ],
)
def test_a_jobs_tag_name_is_one_mlflow_takes(job: str) -> None:
    name = f"unsupported.{job_tag(job)}"
    _validate_tag_name(name)  # raises MlflowException for a name MLflow refuses
    assert "//" not in name and "/../" not in f"/{name}/"
