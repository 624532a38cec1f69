"""The MLflow pyfunc model of a .tflite file (FP32 or quantized), logged as code with ``litert_runner.py``
beside it: loading it needs ``ai_edge_litert`` and numpy, not this project.

``mlflow.pyfunc.load_model(uri).predict(images)`` takes NHWC float32 raw 0-255 pixels and returns class
probabilities, run by LiteRT's default kernels (XNNPACK where it applies): the runtime form.
"""

import mlflow
import numpy as np


class TFLiteModel(mlflow.pyfunc.PythonModel):
    """A .tflite file (artifact ``model``) as a pyfunc."""

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        from litert_runner import TFLiteRunner  # shipped beside this file (code_paths)

        self.runner = TFLiteRunner(context.artifacts["model"])

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        return self.runner(np.asarray(model_input, dtype=np.float32))


mlflow.models.set_model(TFLiteModel())
