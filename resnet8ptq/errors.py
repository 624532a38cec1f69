"""The errors a run reports to its user, on the ground floor so that any module can raise them without
importing the module that handles them (:mod:`resnet8ptq.app` turns each into a one-line message and a
FAILED run, or, for :class:`Unsupported` in a sweep, a skipped configuration)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting has a value of the right type that is not allowed (e.g. calib.percentile=101)."""


class RaisedLayerError(ConfigError):
    """A name in `raised_layers` that cannot be raised (unknown, or taking its input's quantization)."""


class Unsupported(ValueError):
    """The backend cannot run this configuration exactly (e.g. a bit width its format cannot hold); the
    message says what it can run. Raised by ``Backend.check`` before any work."""


class DataError(RuntimeError):
    """A CIFAR-10 data problem (missing, corrupted, malformed, or a bad sampling request)."""


class ModelError(RuntimeError):
    """The model file is missing, corrupt, or cannot be converted."""


class TrackingError(RuntimeError):
    """The MLflow tracking server or store cannot be used."""


class TargetNotReached(RuntimeError):
    """Mixed precision's steps ended (no layer left to raise, or target.max_steps) above the target drop."""


class ReportError(RuntimeError):
    """The runs to report on cannot be found."""


class ExportError(Exception):
    """The run cannot be exported (no such run, not quantized, no model file)."""
