"""Which SGLang builds the adapter is tested against, and the start-up check that refuses any other.

The hooks attach to scheduler internals (``Scheduler.get_next_batch_to_run``, ``run_batch``,
``process_batch_result``, ``SchedulerOutputStreamer.stream_output``) and to the decoder layers' ``capture_output``
argument; SGLang moves these between patch releases, so the range is exact builds, each tested.
"""

from __future__ import annotations

import importlib.metadata as md

__all__ = ["SUPPORTED_VERSIONS", "UnsupportedSglangError", "check_supported_sglang", "installed_sglang"]

#: the exact ``sglang`` versions tested (CPU engine in CI: tests/sglang, scripts/test_sglang.sh).
SUPPORTED_VERSIONS: tuple[str, ...] = ("0.5.23",)


class UnsupportedSglangError(RuntimeError):
    """The installed SGLang is missing or not one of :data:`SUPPORTED_VERSIONS`."""


def installed_sglang() -> str | None:
    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return None


def check_supported_sglang() -> str:
    """Raise :class:`UnsupportedSglangError` unless a tested SGLang is installed; return its version.

    Called before the engine starts, so an unsupported version fails at start-up with the fix, never mid-serve
    inside a scheduler internal that moved.
    """
    version = installed_sglang()
    wanted = ", ".join(f"sglang=={v}" for v in SUPPORTED_VERSIONS)
    if version is None:
        raise UnsupportedSglangError(
            f"SGLang is not installed; install a supported build ({wanted}): `bash scripts/setup_sglang.sh` builds "
            "a CPU environment (.venv-sglang), or `pip install --no-deps sglang==0.5.23` beside your torch")
    if version.split("+")[0] not in SUPPORTED_VERSIONS:
        raise UnsupportedSglangError(
            f"installed sglang=={version} is not supported by deltaserve_sglang (tested: {wanted}); the adapter "
            "hooks scheduler internals that change between releases (docs/sglang-adapter.md)")
    return version
