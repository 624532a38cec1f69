"""Backends, one module each; imported lazily so that an ONNX run never imports torch."""

from __future__ import annotations

import functools
import importlib

from resnet8ptq.backends.base import Backend

BACKENDS = {
    "onnx": "resnet8ptq.backends.onnx:OnnxRuntimeBackend",
    "torch": "resnet8ptq.backends.torch:TorchBackend",
}


@functools.cache
def get_backend(name: str, native: bool = True, threads: int | None = None) -> Backend:
    """The backend registered as ``name`` (the `backend` config choice); one instance per process and
    settings, so that what it caches (the FP32 baseline) is reused by every run of a multirun."""
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r}: expected one of {', '.join(BACKENDS)}.")
    module_name, class_name = BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RuntimeError(
            f"backend={name} needs packages that are not installed ({err.name}). "
            f"Install them with: pip install -e '.[{name}]'"
        ) from err
    return getattr(module, class_name)(native=native, threads=threads)
