"""Tests for resnet8ptq.data: CIFAR-10 reading, checksums, download, and the calibration sampler."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq import data
from resnet8ptq.data import (
    BINARY_DIR,
    CLASS_NAMES,
    PYTHON_DIR,
    Cifar10,
    calibration_indices,
    calibration_set,
    load_cifar10,
    to_model_input,
)
from resnet8ptq.errors import DataError
from tests.cifar_fakes import RECORD, md5, patch_archive

BIN_FILES = (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin")
PY_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
META_TXT = "".join(f"{name}\n" for name in CLASS_NAMES)


def write_tiny_binary(src: Path, dest: Path, records: int) -> None:
    """dest/ ← the first `records` records of every real binary batch, plus batches.meta.txt."""
    dest.mkdir(parents=True)
    for name in BIN_FILES:
        with (src / name).open("rb") as f:
            (dest / name).write_bytes(f.read(records * RECORD))
    (dest / "batches.meta.txt").write_text(META_TXT)


def patch_binary_tables(monkeypatch: pytest.MonkeyPatch, batches: Path) -> None:
    monkeypatch.setattr(data, "BINARY_MD5", {name: md5(batches / name) for name in BIN_FILES})
    monkeypatch.setattr(data, "BINARY_SIZES", {name: (batches / name).stat().st_size for name in BIN_FILES})


def write_tiny_python(cifar: Cifar10, dest: Path, records: int) -> None:
    """dest/ ← official-format pickles holding the first `records` images of each real batch."""
    dest.mkdir(parents=True)
    for i, name in enumerate(PY_FILES):
        if name == "test_batch":
            images, labels = cifar.test_images[:records], cifar.test_labels[:records]
        else:
            images = cifar.train_images[i * 10_000 : i * 10_000 + records]
            labels = cifar.train_labels[i * 10_000 : i * 10_000 + records]
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(x) for x in labels],
            b"data": images.transpose(0, 3, 1, 2).reshape(records, 3072).copy(),
            b"filenames": [f"{name}_{j}.png".encode() for j in range(records)],
        }
        with (dest / name).open("wb") as f:
            pickle.dump(batch, f, protocol=2)


def tiny_expected(cifar: Cifar10, records: int) -> tuple[np.ndarray, np.ndarray]:
    starts = range(0, 50_000, 10_000)
    return (
        np.concatenate([cifar.train_images[s : s + records] for s in starts]),
        np.concatenate([cifar.train_labels[s : s + records] for s in starts]),
    )


def make_archive(path: Path, batches: Path) -> None:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(batches, arcname=BINARY_DIR)


def link_real_files(assets_dir: Path, dest: Path, except_: str) -> None:
    dest.mkdir()
    for name in BIN_FILES:
        if name != except_:
            (dest / name).symlink_to(assets_dir / BINARY_DIR / name)


# --- real data -------------------------------------------------------------------------------------------


def test_real_data_shapes_dtypes_and_layout(cifar: Cifar10, assets_dir: Path) -> None:
    assert cifar.train_images.shape == (50_000, 32, 32, 3)
    assert cifar.test_images.shape == (10_000, 32, 32, 3)
    assert cifar.train_images.dtype == cifar.test_images.dtype == np.uint8
    assert cifar.train_labels.shape == (50_000,)
    assert cifar.test_labels.shape == (10_000,)
    assert cifar.train_labels.dtype == cifar.test_labels.dtype == np.int64
    assert cifar.layout == "binary"
    assert cifar.root == assets_dir
    assert cifar.train_images.flags.c_contiguous
    assert len(CLASS_NAMES) == 10
    assert CLASS_NAMES[0] == "airplane"
    assert CLASS_NAMES[9] == "truck"


def test_real_data_class_balance(cifar: Cifar10) -> None:
    for labels, per_class in ((cifar.train_labels, 5000), (cifar.test_labels, 1000)):
        assert labels.min() == 0
        assert labels.max() == 9
        assert np.bincount(labels).tolist() == [per_class] * 10


def test_real_data_matches_raw_record_bytes(cifar: Cifar10, assets_dir: Path) -> None:
    raw = (assets_dir / BINARY_DIR / "test_batch.bin").read_bytes()[:RECORD]
    image = cifar.test_images[0]
    assert cifar.test_labels[0] == raw[0]
    assert image[0, 0, 0] == raw[1]  # R plane first
    assert image[0, 0, 1] == raw[1 + 1024]  # then G
    assert image[0, 0, 2] == raw[1 + 2048]  # then B
    assert image[1, 2, 0] == raw[1 + 32 + 2]  # row-major: row 1, column 2
    assert image[31, 31, 2] == raw[RECORD - 1]
    # the first record of data_batch_2 is training image 10,000
    raw2 = (assets_dir / BINARY_DIR / "data_batch_2.bin").read_bytes()[:RECORD]
    assert cifar.train_labels[10_000] == raw2[0]
    assert cifar.train_images[10_000].transpose(2, 0, 1).tobytes() == raw2[1:]


def test_arrays_are_read_only(cifar: Cifar10) -> None:
    with pytest.raises(ValueError):
        cifar.train_images[0, 0, 0, 0] = 1
    with pytest.raises(ValueError):
        cifar.test_labels[0] = 1


# --- python pickle layout ----------------------------------------------------------------------------------


def test_python_layout_is_read(tmp_path: Path, cifar: Cifar10, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = tmp_path / PYTHON_DIR
    write_tiny_python(cifar, batches, records=7)
    monkeypatch.setattr(data, "PYTHON_MD5", {name: md5(batches / name) for name in PY_FILES})
    loaded = load_cifar10(tmp_path, download=False)
    assert loaded.layout == "python"
    images, labels = tiny_expected(cifar, 7)
    np.testing.assert_array_equal(loaded.train_images, images)
    np.testing.assert_array_equal(loaded.train_labels, labels)
    np.testing.assert_array_equal(loaded.test_images, cifar.test_images[:7])
    np.testing.assert_array_equal(loaded.test_labels, cifar.test_labels[:7])
    assert loaded.train_labels.dtype == np.int64
    assert loaded.train_images.flags.c_contiguous


def test_binary_layout_preferred_over_python(
    tmp_path: Path, cifar: Cifar10, assets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_python(cifar, tmp_path / PYTHON_DIR, records=3)
    monkeypatch.setattr(data, "PYTHON_MD5", {name: "0" * 32 for name in PY_FILES})  # would fail if used
    link_real_files(assets_dir, tmp_path / BINARY_DIR, except_="")
    assert load_cifar10(tmp_path, download=False).layout == "binary"


def test_tampered_pickle_refused_before_unpickling(
    tmp_path: Path, cifar: Cifar10, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = tmp_path / PYTHON_DIR
    write_tiny_python(cifar, batches, records=3)
    monkeypatch.setattr(data, "PYTHON_MD5", {name: md5(batches / name) for name in PY_FILES})
    tampered = batches / "test_batch"
    tampered.write_bytes(tampered.read_bytes().replace(b"test_batch_0.png", b"evil_batch_0.png"))
    calls = []
    monkeypatch.setattr(pickle, "load", lambda *a, **k: calls.append("load"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append("loads"))
    with pytest.raises(DataError, match=r"test_batch: md5 [0-9a-f]{32}, expected") as info:
        load_cifar10(tmp_path, download=False)
    assert calls == []  # not even the untampered training batches were unpickled
    assert "re-download" in str(info.value)


def test_official_python_checksums_refuse_foreign_pickles(
    tmp_path: Path, cifar: Cifar10, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_python(cifar, tmp_path / PYTHON_DIR, records=3)
    calls = []
    monkeypatch.setattr(pickle, "load", lambda *a, **k: calls.append("load"))
    with pytest.raises(DataError, match="c99cafc152244af753f735de768cd75f"):
        load_cifar10(tmp_path, download=False)
    assert calls == []


# --- corrupted / truncated / missing -----------------------------------------------------------------------


def test_corrupted_binary_file_is_refused(
    tmp_path: Path, assets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = tmp_path / BINARY_DIR
    link_real_files(assets_dir, batches, except_="test_batch.bin")
    content = bytearray((assets_dir / BINARY_DIR / "test_batch.bin").read_bytes())
    content[12_345] ^= 0x01
    (batches / "test_batch.bin").write_bytes(content)
    reads = []
    monkeypatch.setattr(np, "fromfile", lambda *a, **k: reads.append(a))
    with pytest.raises(DataError, match=r"test_batch\.bin: md5 [0-9a-f]{32}, expected 803d5f7f") as info:
        load_cifar10(tmp_path, download=False)
    assert "data_batch" not in str(info.value)  # the untouched files pass
    assert "delete" in str(info.value)
    assert reads == []


def test_truncated_binary_file_is_refused(tmp_path: Path, assets_dir: Path) -> None:
    batches = tmp_path / BINARY_DIR
    link_real_files(assets_dir, batches, except_="data_batch_3.bin")
    with (assets_dir / BINARY_DIR / "data_batch_3.bin").open("rb") as f:
        (batches / "data_batch_3.bin").write_bytes(f.read(100 * RECORD))
    with pytest.raises(DataError, match=r"data_batch_3\.bin: size 307,300 bytes, expected 30,730,000"):
        load_cifar10(tmp_path, download=False)


def test_incomplete_batches_dir_is_not_overwritten(
    tmp_path: Path, assets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link_real_files(assets_dir, tmp_path / BINARY_DIR, except_="data_batch_4.bin")
    monkeypatch.setattr(data, "BINARY_ARCHIVE_URL", (tmp_path / "must-not-be-fetched").as_uri())
    with pytest.raises(DataError, match=r"incomplete: missing data_batch_4\.bin"):
        load_cifar10(tmp_path, download=True)
    assert sorted(p.name for p in (tmp_path / BINARY_DIR).iterdir()) == sorted(
        n for n in BIN_FILES if n != "data_batch_4.bin"
    )


def test_verification_is_cached_until_the_file_changes(
    tmp_path: Path, assets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = tmp_path / "root" / BINARY_DIR
    write_tiny_binary(assets_dir / BINARY_DIR, batches, records=4)
    patch_binary_tables(monkeypatch, batches)
    hashed = []
    real_file_digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, d: hashed.append(f.name) or real_file_digest(f, d))
    load_cifar10(tmp_path / "root", download=False)
    load_cifar10(tmp_path / "root", download=False)
    assert len(hashed) == 6  # each file hashed once across both loads
    target = batches / "test_batch.bin"
    stat = target.stat()
    content = bytearray(target.read_bytes())
    content[-1] ^= 0xFF
    target.write_bytes(content)  # same size; make sure the mtime differs too
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(DataError, match=r"test_batch\.bin: md5"):
        load_cifar10(tmp_path / "root", download=False)


@pytest.fixture
def tiny_root(tmp_path: Path, assets_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root holding the first 4 records of every real binary batch, its checksums the official ones."""
    write_tiny_binary(assets_dir / BINARY_DIR, tmp_path / "root" / BINARY_DIR, records=4)
    patch_binary_tables(monkeypatch, tmp_path / "root" / BINARY_DIR)
    return tmp_path / "root"


def test_checksums_are_remembered_on_disk_until_a_file_changes(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later process (in-process cache cleared) hashes nothing that did not change; a file rewritten with
    its old size and mtime put back is still hashed again (its ctime moved) and refused."""
    hashed = []
    real_file_digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, d: hashed.append(f.name) or real_file_digest(f, d))
    cache = tmp_path / "cache" / "cifar10-md5.json"
    first = load_cifar10(tiny_root, download=False, md5_cache=cache)
    assert len(hashed) == 6 and cache.is_file()
    data._md5_of.cache_clear()  # as in a new process
    again = load_cifar10(tiny_root, download=False, md5_cache=cache)
    assert len(hashed) == 6, "unchanged files were hashed again"
    np.testing.assert_array_equal(again.test_images, first.test_images)

    target = tiny_root / BINARY_DIR / "test_batch.bin"
    stat = target.stat()
    content = bytearray(target.read_bytes())
    content[-1] ^= 0xFF
    target.write_bytes(content)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and mtime as before
    with pytest.raises(DataError, match=r"test_batch\.bin: md5"):
        load_cifar10(tiny_root, download=False, md5_cache=cache)
    assert hashed[6:] == [str(target)]


def test_an_unreadable_checksum_cache_is_rebuilt(tiny_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cifar10-md5.json"
    cache.write_text("{not json")
    assert load_cifar10(tiny_root, download=False, md5_cache=cache).layout == "binary"
    assert len(json.loads(cache.read_text())) == 6


def test_a_checksum_cache_that_cannot_be_written_costs_only_a_rehash(tiny_root: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    loaded = load_cifar10(tiny_root, download=False, md5_cache=blocker / "cifar10-md5.json")
    assert loaded.layout == "binary"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-directory", "root"]


# --- download ----------------------------------------------------------------------------------------------


def test_download_installs_the_archive(
    tmp_path: Path, assets_dir: Path, cifar: Cifar10, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = tmp_path / "staging" / BINARY_DIR
    write_tiny_binary(assets_dir / BINARY_DIR, staging, records=5)
    patch_binary_tables(monkeypatch, staging)
    archive = tmp_path / "cifar-10-binary.tar.gz"
    make_archive(archive, staging)
    patch_archive(monkeypatch, archive)
    root = tmp_path / "data" / "cifar"
    loaded = load_cifar10(root, download=True)
    assert loaded.layout == "binary"
    assert loaded.root == root
    images, labels = tiny_expected(cifar, 5)
    np.testing.assert_array_equal(loaded.train_images, images)
    np.testing.assert_array_equal(loaded.train_labels, labels)
    np.testing.assert_array_equal(loaded.test_images, cifar.test_images[:5])
    assert [p.name for p in root.iterdir()] == [BINARY_DIR]  # no temp archive or extract dir left
    assert sorted(p.name for p in (root / BINARY_DIR).iterdir()) == sorted([*BIN_FILES, "batches.meta.txt"])
    # a second load uses the installed files and does not download again
    monkeypatch.setattr(data, "BINARY_ARCHIVE_URL", (tmp_path / "gone.tar.gz").as_uri())
    assert load_cifar10(root, download=True).train_labels.shape == (25,)


def test_download_with_wrong_md5_leaves_nothing(
    tmp_path: Path, assets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = tmp_path / "staging" / BINARY_DIR
    write_tiny_binary(assets_dir / BINARY_DIR, staging, records=2)
    archive = tmp_path / "cifar-10-binary.tar.gz"
    make_archive(archive, staging)
    patch_archive(monkeypatch, archive, md5sum="0123456789abcdef0123456789abcdef")
    root = tmp_path / "root"
    with pytest.raises(DataError, match=rf"md5 {md5(archive)}, expected 0123456789abcdef"):
        load_cifar10(root, download=True)
    assert list(root.iterdir()) == []


# --- calibration sampler -----------------------------------------------------------------------------------


def test_calibration_indices_are_stratified_sorted_and_seeded(cifar: Cifar10) -> None:
    idx = calibration_indices(cifar.train_labels, per_class=100, seed=0)
    assert idx.shape == (1000,)
    assert np.bincount(cifar.train_labels[idx], minlength=10).tolist() == [100] * 10
    assert np.all(np.diff(idx) > 0)  # sorted, no duplicates
    assert idx.min() >= 0
    assert idx.max() < 50_000
    np.testing.assert_array_equal(idx, calibration_indices(cifar.train_labels, per_class=100, seed=0))
    assert not np.array_equal(idx, calibration_indices(cifar.train_labels, per_class=100, seed=1))
    assert not np.array_equal(idx, np.arange(1000))


def test_calibration_set_comes_from_the_training_split(cifar: Cifar10) -> None:
    images, labels = calibration_set(cifar, per_class=10, seed=3)
    idx = calibration_indices(cifar.train_labels, per_class=10, seed=3)
    assert images.shape == (100, 32, 32, 3)
    assert images.dtype == np.float32
    assert images.flags.c_contiguous
    assert images.max() > 1.0  # raw 0..255, not normalised
    np.testing.assert_array_equal(images, cifar.train_images[idx].astype(np.float32))
    np.testing.assert_array_equal(labels, cifar.train_labels[idx])
    test_set = {image.tobytes() for image in cifar.test_images}
    assert not any(image.astype(np.uint8).tobytes() in test_set for image in images)


@pytest.mark.parametrize("per_class", [0, -1, 5001, 2.5, "10", True, None])
def test_calibration_rejects_bad_per_class(cifar: Cifar10, per_class: object) -> None:
    with pytest.raises(DataError, match=r"1\.\.5000") as info:
        calibration_indices(cifar.train_labels, per_class=per_class, seed=0)  # type: ignore[arg-type]
    assert repr(per_class) in str(info.value) or str(per_class) in str(info.value)


def test_calibration_accepts_the_full_class(cifar: Cifar10) -> None:
    idx = calibration_indices(cifar.train_labels, per_class=5000, seed=0)
    np.testing.assert_array_equal(idx, np.arange(50_000))


def test_calibration_rejects_bad_seed(cifar: Cifar10) -> None:
    with pytest.raises(DataError, match="seed"):
        calibration_indices(cifar.train_labels, per_class=1, seed=-1)


# --- model input -------------------------------------------------------------------------------------------


def test_to_model_input_is_raw_contiguous_float32(cifar: Cifar10) -> None:
    view = cifar.test_images[:8, :, ::-1]  # a non-contiguous view
    out = to_model_input(view)
    assert out.dtype == np.float32
    assert out.shape == (8, 32, 32, 3)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, view.astype(np.float32))
    with pytest.raises(DataError, match="uint8"):
        to_model_input(out)
    with pytest.raises(DataError, match=r"\(N, 32, 32, 3\)"):
        to_model_input(cifar.test_images[:2].transpose(0, 3, 1, 2))
