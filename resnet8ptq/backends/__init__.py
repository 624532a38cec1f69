"""Backends, one package each (``onnx/``, ``torch/``, ``tflite/``): ``config.py`` (typed options),
``backend.py`` (the :class:`~resnet8ptq.backends.base.Backend`) and ``integer.py`` (the saved model read into
the device model's integer form). ``conf/backend/<name>.yaml`` names the class as ``_target_``; Hydra's
``instantiate`` builds it, importing the heavy libraries only for the backend a run uses."""
