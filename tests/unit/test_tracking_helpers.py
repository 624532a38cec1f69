"""Small tracking helpers: MLflow filters that values cannot break, content digests, the UI's runs page."""

from __future__ import annotations

import numpy as np
import pytest

from resnet8ptq.tracking.models import content_digest
from resnet8ptq.tracking.search import equals, where
from resnet8ptq.tracking.store import runs_page


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
