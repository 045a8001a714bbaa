"""TEST-ONLY: let SGLang's LoRA layers run on a CPU-only torch build.

Why it exists: ``sglang/srt/lora/layers.py`` (0.5.23) builds small host-side index tensors with
``torch.tensor(..., device="cpu", pin_memory=True)`` and its torch-native LoRA backend calls
``tensor.pin_memory()`` per batch. Pinning needs an accelerator; a CPU-only torch raises
("Cannot access accelerator device when none is available"), so the CPU engine cannot load any LoRA adapter.
Pinning only speeds up host-to-device copies, so on a machine with no accelerator dropping it changes nothing
else. :func:`apply` wraps the few torch factory functions SGLang calls that way and makes
``Tensor.pin_memory()`` return the tensor itself; it does nothing where an accelerator exists.

``torch.tensor`` is the exception: replacing it process-wide corrupts transformers+PEFT forwards in the same
process (measured: the conformance suite's PEFT reference of the tiny Llama moved by ~1.5 at layer 1, differently
on every run), and the test process computes those references beside the in-process SGLang scheduler. So
``torch.tensor`` is only replaced inside the SGLang modules that pin with it (:data:`TENSOR_PINNING_MODULES`), through
a ``torch`` proxy bound to those modules' globals as they are imported (an import hook, so that it also works
in processes that import SGLang later or never).

It lives under ``tests/``: the product never imports it. ``tests/sglang/conftest.py`` applies it in the test
process, and ``sitecustomize.py`` beside it applies it in SGLang's subprocesses (this folder is on their
``PYTHONPATH`` in the tests only).
"""

from __future__ import annotations

import functools

import torch

_FACTORIES = ("empty", "zeros", "ones", "full", "as_tensor")
#: SGLang 0.5.23 modules (torch-native LoRA path) that call ``torch.tensor(..., pin_memory=True)``.
TENSOR_PINNING_MODULES = ("sglang.srt.lora.layers", "sglang.srt.lora.backend.torch_backend")


def _drop_pin(original):
    @functools.wraps(original)
    def factory(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return original(*args, **kwargs)

    return factory


class _TorchWithoutPinnedTensor:
    """``torch`` as seen by one SGLang module: ``tensor`` drops ``pin_memory``, everything else is torch's."""

    tensor = staticmethod(_drop_pin(torch.tensor))

    def __getattr__(self, name: str):
        return getattr(torch, name)


class _BindProxyOnImport:
    """Meta-path finder: once a module of :data:`TENSOR_PINNING_MODULES` is executed, rebind its ``torch``."""

    def find_spec(self, fullname: str, path: object, target: object = None):
        if fullname not in TENSOR_PINNING_MODULES:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_bind(module):
            exec_module(module)
            module.torch = _TorchWithoutPinnedTensor()

        spec.loader.exec_module = exec_and_bind  # type: ignore[method-assign]
        return spec


def apply() -> None:
    if torch.cuda.is_available() or getattr(torch, "_deltaserve_pin_memory_shim", False):
        return
    import sys

    sys.meta_path.insert(0, _BindProxyOnImport())
    for name in _FACTORIES:
        original = getattr(torch, name)

        @functools.wraps(original)
        def factory(*args, __original=original, **kwargs):
            kwargs.pop("pin_memory", None)
            return __original(*args, **kwargs)

        setattr(torch, name, factory)
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch._deltaserve_pin_memory_shim = True  # type: ignore[attr-defined]
