"""The MLflow pyfunc model of a torch.export ``.pt2`` (FP32 or PT2E-quantized), logged as code: MLflow copies
this file into the model, so loading it needs torch and torchao, not this project.

``mlflow.pyfunc.load_model(uri).predict(images)`` takes NHWC float32 raw 0-255 pixels and returns class
probabilities, running the program eagerly (a quantized program: its exact quantize/dequantize semantics).
"""

import mlflow
import numpy as np

BATCH = 500  # images per forward pass: bounds activation memory for large inputs


class ExportedProgramModel(mlflow.pyfunc.PythonModel):
    """A ``.pt2`` (artifact ``program``) as a pyfunc."""

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        import torch
        import torchao.quantization.pt2e  # noqa: F401  registers the quantized_decomposed ops a .pt2 uses

        self.module = torch.export.load(context.artifacts["program"]).module()

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        import torch

        images = np.ascontiguousarray(model_input, dtype=np.float32)
        with torch.inference_mode():
            parts = [
                self.module(torch.from_numpy(images[i : i + BATCH])) for i in range(0, len(images), BATCH)
            ]
        return torch.cat(parts).numpy() if parts else np.zeros((0, 10), np.float32)


mlflow.models.set_model(ExportedProgramModel())
