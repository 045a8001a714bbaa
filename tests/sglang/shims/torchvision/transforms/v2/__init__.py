"""Stub (see torchvision/__init__.py)."""

from ..._stub import InterpolationMode, missing
from . import functional  # noqa: F401

__all__ = ["InterpolationMode"]


def __getattr__(name: str):
    return missing("torchvision.transforms.v2", name)
