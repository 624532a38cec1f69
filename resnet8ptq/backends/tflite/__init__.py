"""TensorFlow Lite / LiteRT backend. The class is :class:`resnet8ptq.backends.tflite.backend.TFLiteBackend`;
this package imports nothing heavy, so that registering its config schema does not import LiteRT."""
