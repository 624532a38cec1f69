"""Visual Wake Words as MLPerf Tiny's ``train_vww.py`` reads it: Keras' ``flow_from_directory`` over
``vw_coco2014_96/`` with ``validation_split=0.1``, images 96 x 96 RGB (resized nearest-neighbour where they
are not), scaled by ``rescale=1/255``.

* Test inputs: Keras' validation subset, which MLPerf's script scores: per class folder, the first 10 % of
  its image files in sorted order. The script also applies its training augmentation (rotation, shifts,
  zoom, flips) to that subset; the tool does not: a test set is scored as it is.
* Labels: the class folders in sorted order, as Keras numbers them: ``non_person`` 0, ``person`` 1.
* Calibration inputs: ``--calibration`` images (default 200) drawn with ``--seed`` from the other 90 %
  (MLPerf's own calibration list names 10 COCO files, which are not in the folder by those names).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.errors import DataError
from resnet8ptq.mlperf_data.base import Options, Prepared, Preparer, labelled, seeded_sample, sorted_files

IMAGE_SIZE = (96, 96)
CLASSES = ("non_person", "person")  # sorted folder names: Keras' class indices
VALIDATION_SPLIT = 0.1
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".tif", ".tiff")  # Keras' white list


def split(source: Path) -> tuple[list[tuple[Path, int]], list[Path]]:
    """(test files with their labels, training files): Keras' validation and training subsets."""
    test, training = [], []
    for label, name in enumerate(CLASSES):
        files = sorted_files(source / name, IMAGE_SUFFIXES)
        stop = int(VALIDATION_SPLIT * len(files))
        test += [(file, label) for file in files[:stop]]
        training += files[stop:]
    return test, training


def check(source: Path, options: Options) -> None:
    """Refuse a folder without both class folders, or one with too few images for a test subset."""
    missing = [name for name in CLASSES if not (source / name).is_dir()]
    if missing:
        raise DataError(f"vww: {source} has no {' or '.join(missing)}/ folder (vw_coco2014_96's layout)")
    test, _ = split(source)
    for label, name in enumerate(CLASSES):
        if not any(test_label == label for _, test_label in test):
            raise DataError(f"vww: {source / name} has fewer than 10 images: its 10 % test subset is empty")


def image(path: Path) -> np.ndarray:
    """One image as Keras' ``load_img`` and ``rescale=1/255`` give it: RGB, 96 x 96 (nearest), float32."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            rgb = opened.convert("RGB") if opened.mode != "RGB" else opened
            if rgb.size != IMAGE_SIZE[::-1]:
                rgb = rgb.resize(IMAGE_SIZE[::-1], Image.NEAREST)
            pixels = np.asarray(rgb, dtype=np.float32)
    except (OSError, UnidentifiedImageError) as error:
        raise DataError(f"vww: {path} is not an image PIL reads ({error})") from error
    return pixels * np.float32(1.0 / 255)  # as Keras' ``x *= rescale`` on float32


def images(paths: list[Path], what: str) -> np.ndarray:
    """The images at ``paths`` as one (N, 96, 96, 3) float32 array, with a progress bar."""
    return np.stack([image(path) for path in tqdm(paths, desc=f"vww {what}", unit="image")])


def prepare(source: Path, options: Options) -> Prepared:
    """The VWW test subset and a calibration sample from the rest."""
    test, training = split(source)
    return labelled(images, test, seeded_sample(training, options.calibration, options.seed), CLASSES)


PREPARER = Preparer(
    check=check,
    prepare=prepare,
    source="vw_coco2014_96/ (person/, non_person/) of vw_coco2014_96.tar.gz, as MLPerf Tiny's "
    "download_and_train_vww.sh downloads it (from Silicon Labs)",
)
