"""Stub (see torchvision/__init__.py)."""

from ..._stub import InterpolationMode, missing

__all__ = ["InterpolationMode"]


def __getattr__(name: str):
    return missing("torchvision.transforms.v2.functional", name)
