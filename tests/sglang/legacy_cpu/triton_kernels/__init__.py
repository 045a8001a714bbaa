"""TEST-ONLY stand-in for triton_kernels (shipped inside sglang-kernel, CUDA only), for SGLang 0.5.15's CPU engine
here; see ../flashinfer/__init__.py."""

import flashinfer  # noqa: F401  (installs the submodule stand-in for both packages)
from flashinfer import _ANY


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _ANY
