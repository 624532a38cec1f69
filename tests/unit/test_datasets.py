"""A user's own data (data=npz) and the model's classes: read, checked against the model, refused with what is
wrong before any work; the generator helper writes what the reader takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from resnet8ptq.datasets import Dataset, check_fits, class_names, generate, load_npz, main
from resnet8ptq.errors import DataError
from resnet8ptq.metrics import TOP1, metric


def write(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def valid(**changes: np.ndarray) -> dict[str, np.ndarray]:
    """A small valid data set's arrays (49 x 10 x 1 inputs: KWS's shape), with ``changes``."""
    rng = np.random.default_rng(0)
    arrays = {
        "calibration_inputs": rng.random((8, 49, 10, 1)).astype(np.float32),
        "test_inputs": rng.random((12, 49, 10, 1)),  # float64: read as float32
        "test_labels": np.arange(12) % 3,
    }
    return {**arrays, **changes}


def test_an_npz_is_read_as_model_inputs(tmp_path: Path) -> None:
    path = write(tmp_path / "d.npz", **valid(class_names=np.array(["a", "b", "c"])))
    data = load_npz(path)
    assert data.name == "npz" and data.source == path
    assert data.test_inputs.dtype == np.float32 and data.test_inputs.shape == (12, 49, 10, 1)
    assert data.calibration_inputs.shape == (8, 49, 10, 1) and data.calibration_labels is None
    assert data.test_labels.dtype == np.int64 and data.class_names == ("a", "b", "c")
    assert data.verified.startswith("sha256 ") and data.perf_subset.size == 0
    with pytest.raises(ValueError):
        data.test_labels[0] = 1  # shared by the runs of a process: read-only


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"test_labels": None}, "lacks test_labels"),
        ({"test_labels": np.arange(11)}, r"expected integers of shape \(12,\)"),
        ({"test_labels": np.linspace(0, 1, 12)}, "test_labels are float64"),
        ({"test_labels": np.arange(12) - 1}, "test_labels hold -1"),
        ({"calibration_inputs": np.zeros((4, 10, 49, 1))}, r"calibration_inputs are \(10, 49, 1\)"),
        ({"test_inputs": np.zeros(12)}, r"test_inputs has shape \(12,\)"),
        ({"test_inputs": np.array(["x"] * 12)}, "expected real numbers"),
    ],
)
def test_a_bad_npz_is_refused_naming_what_is_wrong(tmp_path: Path, arrays: dict, message: str) -> None:
    contents = {key: value for key, value in valid(**arrays).items() if value is not None}
    with pytest.raises(DataError, match=message):
        load_npz(write(tmp_path / "bad.npz", **contents))


def test_a_missing_or_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_npz(tmp_path / "absent.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(DataError, match=r"not a readable \.npz"):
        load_npz(tmp_path / "text.npz")


def dataset(shape: tuple[int, ...] = (49, 10, 1), labels: int = 3, names: tuple[str, ...] = ()) -> Dataset:
    inputs = np.zeros((6, *shape), np.float32)
    return Dataset("npz", inputs, np.arange(6) % labels, inputs, None, Path("d.npz"), "sha256 x", names)


def test_data_is_checked_against_the_model() -> None:
    check_fits(dataset(), (49, 10, 1), (12,), TOP1, "model=kws")  # fits
    check_fits(dataset(), (None, None, 1), (12,), TOP1, "model=kws")  # free dimensions take any size
    with pytest.raises(DataError, match=r"takes inputs of shape \(N, 96, 96, 3\).*gives \(N, 49, 10, 1\)"):
        check_fits(dataset(), (96, 96, 3), (2,), TOP1, "model=vww")
    with pytest.raises(DataError, match=r"has 2 outputs .*labels reach 2"):
        check_fits(dataset(), (49, 10, 1), (2,), TOP1, "model=x")
    with pytest.raises(DataError, match=r"labels have 3 classes; data=npz names 2 \(a, b\)"):
        check_fits(dataset(labels=2, names=("a", "b")), (49, 10, 1), (3,), TOP1, "model=x")


def test_an_autoencoders_data_is_normal_and_anomalous_samples() -> None:
    auc = metric("auc")
    check_fits(dataset(shape=(640,), labels=2), (640,), (640,), auc, "model=ad")
    with pytest.raises(DataError, match=r"labels 0 \(normal\) and 1 \(anomalous\), both present"):
        check_fits(dataset(shape=(640,), labels=3), (640,), (640,), auc, "model=ad")
    with pytest.raises(DataError, match="scores a reconstruction of the input"):
        check_fits(dataset(shape=(640,), labels=2), (640,), (2,), auc, "model=ad")


def test_class_names_come_from_the_model_then_the_data_then_numbers() -> None:
    assert class_names(["x", "y"], dataset(names=("a", "b")), 2, "m") == ("x", "y")
    assert class_names([], dataset(names=("a", "b")), 2, "m") == ("a", "b")
    assert class_names([], dataset(), 3, "m") == ("0", "1", "2")
    with pytest.raises(DataError, match=r"model\.classes names 2"):
        class_names(["x", "y"], dataset(), 3, "m")


def test_the_generator_writes_what_the_reader_takes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    main(["generate", str(tmp_path / "vww.npz"), "--shape", "96,96,3", "--classes", "2", "--test", "5"])
    assert "data=npz data.path=" in capsys.readouterr().out
    data = load_npz(tmp_path / "vww.npz")
    assert data.test_inputs.shape == (5, 96, 96, 3) and data.calibration_inputs.shape == (200, 96, 96, 3)
    assert set(data.test_labels) <= {0, 1}
    again = load_npz(generate(tmp_path / "again.npz", (96, 96, 3), 2, 5, 200, 0))
    assert np.array_equal(again.test_inputs, data.test_inputs)  # seeded


def test_groups_are_one_label_each(tmp_path: Path) -> None:
    def written(groups: list) -> Path:
        inputs, path = np.zeros((6, 640), np.float32), tmp_path / "ad.npz"
        labels = np.array([0, 0, 1, 1, 0, 1])
        np.savez(path, calibration_inputs=inputs, test_inputs=inputs, test_labels=labels, test_groups=groups)
        return path

    assert load_npz(written([0, 0, 1, 1, 2, 3])).test_groups.tolist() == [0, 0, 1, 1, 2, 3]
    with pytest.raises(DataError, match="test_groups 0 hold inputs of different labels"):
        load_npz(written([0, 0, 0, 1, 2, 3]))
    with pytest.raises(DataError, match="test_groups are float64"):
        load_npz(written([0.5] * 6))
