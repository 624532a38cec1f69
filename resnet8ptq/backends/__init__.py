"""Backends, one package each (``onnx/``, ``torch/``): ``config.py`` (typed options) and ``backend.py`` (the
:class:`~resnet8ptq.backends.base.Backend`). ``conf/backend/<name>.yaml`` names the class as ``_target_``;
Hydra's ``instantiate`` builds it, importing the heavy libraries only for the backend a run uses."""
