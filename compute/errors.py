"""Exceptions of the compute package.

Everything compute/ raises on purpose derives from `ComputeError`, so a caller
(a server, the CLI) can catch one type. Each subclass message says what was
expected and what came instead.
"""

from __future__ import annotations


class ComputeError(Exception):
    """Root of every error raised on purpose by compute/."""


class ConfigError(ComputeError, ValueError):
    """A configuration or parameter is out of range or inconsistent."""


class ModelFileError(ComputeError):
    """A weights file is missing, unreadable, or holds unexpected tensors."""


class ShapeError(ComputeError, ValueError):
    """A tensor handed to the model has the wrong shape, dtype or range."""


class DeviceError(ComputeError):
    """A tensor lives on a different device than the weights it meets."""


class CacheError(ComputeError):
    """A KV cache was asked for a layer or position it does not hold."""


class CacheFullError(CacheError):
    """The KV cache (the token budget) has no room for the tokens of a step."""


class TokenizerError(ComputeError):
    """The tokenizer metadata is incomplete or unsupported, or a chat template fails."""


class OptimizerStateError(ComputeError, ValueError):
    """An optimizer state does not fit the slices it is loaded into."""
