"""TEST-ONLY stub of ``torchvision`` so SGLang's CPU engine imports in DeltaServe's SGLang test environment.

Why it exists: ``sglang==0.5.23`` imports ``torchvision.transforms`` at import time from its multimodal config
modules (``sglang/srt/configs/__init__.py`` -> ``nano_nemotron_vl`` -> ``multimodal/internvl_utils.py``), even for
text-only models, and transformers then imports more of it (``torchvision.io``...). PyPI's ``torchvision`` wheel
is built against CUDA torch and fails to load beside the CPU build of torch 2.13.0 ("operator torchvision::nms
does not exist"); the CPU build lives on an index CI cannot reach. The text-only engine path never calls
torchvision: every name (and every ``torchvision.*`` submodule) resolves to a placeholder that raises when called.
The product never imports this; ``tests/sglang/conftest.py`` puts this folder on the path only when no working
torchvision is installed.
"""

import importlib.abc
import importlib.machinery
import sys
import types

from ._stub import missing

__version__ = "0.0.0+deltaserve.test.stub"
__deltaserve_test_shim__ = True


class _AnySubmodule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves any ``torchvision.*`` module without a file here to a module of placeholders."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("torchvision."):
            return None
        if importlib.machinery.PathFinder.find_spec(fullname, path) is not None:
            return None  # a real stub file (transforms...) takes precedence
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        module.__getattr__ = lambda name, _m=spec.name: missing(_m, name)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module) -> None:
        return None


if not any(isinstance(f, _AnySubmodule) for f in sys.meta_path):
    sys.meta_path.append(_AnySubmodule())

from . import transforms  # noqa: F401


def __getattr__(name: str):
    return missing("torchvision", name)
