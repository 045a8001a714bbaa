"""Stub (see torchvision/__init__.py)."""

from .._stub import InterpolationMode, missing
from . import functional, v2  # noqa: F401

__all__ = ["InterpolationMode"]


def __getattr__(name: str):
    return missing("torchvision.transforms", name)
