"""ONNX Runtime backend. The class is :class:`resnet8ptq.backends.onnx.backend.OnnxRuntimeBackend`."""
