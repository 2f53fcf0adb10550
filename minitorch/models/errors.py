"""User-facing errors of the models layer (one clear line each, naming the file)."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model file or folder is missing, truncated, corrupt or unsupported."""


class IncompatibleModelsError(ValueError):
    """A draft/target pair that cannot be used together (different tokenizers)."""
