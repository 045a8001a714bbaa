"""Placeholders for the stub ``torchvision`` package (see ``torchvision/__init__.py`` for why it exists)."""

from __future__ import annotations

import enum
from typing import Any

_WHY = ("torchvision is a test-only stub in DeltaServe's SGLang test environment (tests/sglang/shims): "
        "image processing is not available there")


class _Missing:
    """Stands for any torchvision name: attribute access works (module-level defaults), calling raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: {_WHY}")

    def __mro_entries__(self, bases: tuple) -> tuple:  # `class X(torchvision.something)` at import time
        return (object,)


def missing(module: str, name: str) -> _Missing:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(f"{module}.{name}")


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"
