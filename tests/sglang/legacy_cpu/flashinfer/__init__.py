"""TEST-ONLY stand-in for flashinfer, for running SGLang 0.5.15's *CPU* engine here (scripts/test_sglang_0515_cpu.sh).

SGLang 0.5.15 imports flashinfer at import time on every device (its MoE token dispatcher imports ``flashinfer.comm``,
which needs a loaded libcudart); its CPU engine never calls it. Every attribute and submodule is a do-nothing
placeholder. Never on the product's path, never on the GPU (there the real flashinfer-python is carried).
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Anything:
    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key):
        return self

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases):
        return (object,)


_ANY = _Anything()


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _ANY


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("flashinfer", "triton_kernels") and "." in name:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Submodules) for f in sys.meta_path):
    sys.meta_path.insert(0, _Submodules())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _ANY


__version__ = "0.6.12"
