"""Images fed to ONNX Runtime's calibrators through its ``CalibrationDataReader``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader
from tqdm import tqdm

from resnet8ptq.calibration import batches


class ImageReader(CalibrationDataReader):
    """Feeds calibration images to ORT in fixed, ordered batches (one pass)."""

    def __init__(
        self, images: np.ndarray, batch_size: int, input_name: str, desc: str = "Calibrating (onnx)"
    ) -> None:
        self._batches = batches(images, batch_size)
        self._input_name = input_name
        self._bar = tqdm(total=-(-len(images) // batch_size), desc=desc, unit="batch", leave=False)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        if batch is None:
            self._bar.close()
            return None
        self._bar.update()
        return {self._input_name: batch}


def input_name(path: Path) -> str:
    return onnx.load(path, load_external_data=False).graph.input[0].name
