"""Files MLPerf Tiny publishes beside the model (github.com/mlcommons/tiny,
benchmark/training/image_classification/): the 200-image performance subset its results are reported on, and
its own int8 TFLite model.

Found like the .h5: ``$RESNET8PTQ_ASSETS/models/<file>``, else the cache, downloaded there (sha256-checked,
atomically) when absent.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from resnet8ptq.errors import DataError, ModelError
from resnet8ptq.fetch import ASSETS_ENV, FetchError, published_file, sha256_of

REPOSITORY = "https://github.com/mlcommons/tiny/raw/master/benchmark/training/image_classification/"

PERF_SUBSET_FILENAME = "mlperf_perf_samples_idxs.npy"
PERF_SUBSET_URL = REPOSITORY + "perf_samples_idxs.npy"
PERF_SUBSET_SHA256 = "3bd4a88eeb4c50fad652d0f24c8af13bc9219ba2878aea47c6536bfbeb43024d"
PERF_SUBSET_SIZE = 200  # 20 test images per class, drawn by MLPerf's get_perf_samples_idxs.py (seed 8108)
TEST_SET_SIZE = 10_000

QUANT_MODEL_FILENAME = "pretrainedResnet_quant.tflite"
QUANT_MODEL_URL = REPOSITORY + "trained_models/pretrainedResnet_quant.tflite"
QUANT_MODEL_SHA256 = "3c002613d1b2475eb51dd78dfb85a546c8ae658dee71cf6ade43b022fe205415"


def _verified(filename: str, url: str, sha256: str, cache_dir: Path, what: str) -> Path:
    """The published file, its sha256 checked; raises FetchError (download) or ValueError (sha256)."""
    path = published_file(filename, url, sha256, cache_dir, what)
    actual = sha256_of(path)
    if actual != sha256:
        raise ValueError(
            f"{path}: sha256 {actual} does not match that of {what} ({sha256}); replace it with a copy of "
            f"{url}."
        )
    return path


@functools.cache
def perf_subset_indices(cache_dir: Path) -> np.ndarray:
    """The test-set indices of MLPerf Tiny's 200-image performance subset (read once per process)."""
    what = "MLPerf Tiny's performance-subset indices"
    try:
        path = _verified(PERF_SUBSET_FILENAME, PERF_SUBSET_URL, PERF_SUBSET_SHA256, cache_dir, what)
    except (FetchError, ValueError) as err:
        raise DataError(
            f"{err}\nEvery run reports accuracy on MLPerf Tiny's performance subset: set {ASSETS_ENV} to a "
            f"directory holding models/{PERF_SUBSET_FILENAME}, or allow the download."
        ) from err
    indices = np.load(path, allow_pickle=False)
    if (
        indices.shape != (PERF_SUBSET_SIZE,)
        or not np.issubdtype(indices.dtype, np.integer)
        or len(np.unique(indices)) != PERF_SUBSET_SIZE
        or indices.min() < 0
        or indices.max() >= TEST_SET_SIZE
    ):
        raise DataError(f"{path}: expected {PERF_SUBSET_SIZE} distinct test-set indices, got {indices!r}")
    return indices


def quantized_model(cache_dir: Path) -> Path:
    """MLPerf Tiny's own int8 TFLite model of the ResNet8 (``pretrainedResnet_quant.tflite``)."""
    what = "MLPerf Tiny's int8 TFLite model"
    try:
        return _verified(QUANT_MODEL_FILENAME, QUANT_MODEL_URL, QUANT_MODEL_SHA256, cache_dir, what)
    except (FetchError, ValueError) as err:
        raise ModelError(
            f"{err}\nSet {ASSETS_ENV} to a directory holding models/{QUANT_MODEL_FILENAME}, allow the "
            f"download, or set backend.mlperf_reference=false."
        ) from err
