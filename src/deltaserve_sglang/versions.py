"""Which SGLang builds the adapter supports, and the start-up checks that refuse any other.

The hooks attach to scheduler internals (``Scheduler.get_next_batch_to_run``, ``run_batch``,
``process_batch_result``, ``_get_new_batch_prefill_raw``, ``SchedulerOutputStreamer.stream_output``), to the
decoder layers' forward arguments and to the CUDA-graph runners' ``can_run_graph``; SGLang moves these between
patch releases. The supported range is 0.5.15 .. 0.5.23, its two ends tested:

- **0.5.15** on CUDA (the GPU machine's torch 2.11.0 is the torch it pins; ``benchmarks/gpu/sglang_h200.sh``);
- **0.5.23** on CPU (CI: tests/sglang, ``scripts/test_sglang.sh``).

Between the two ends the internals DeltaServe calls changed shape (read in both releases' source, see
docs/sglang-adapter.md, "Supported versions"): :data:`SHAPES` lists every hooked or called symbol with the
parameter lists of both ends, and :func:`check_hook_shapes` compares them with the installed SGLang at start-up, so
a release inside the range whose internals match neither end is refused with the symbol named, before anything
runs, never mid-serve.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import inspect
from typing import Any

__all__ = ["OLDEST", "NEWEST", "SHAPES", "SUPPORTED_VERSIONS", "TESTED", "UnsupportedSglangError",
           "check_hook_shapes", "check_supported_sglang", "installed_sglang", "is_legacy", "parse"]

#: the two ends of the supported range (inclusive), each tested (:data:`TESTED`).
OLDEST, NEWEST = "0.5.15", "0.5.23"
#: the tested builds and where each was tested.
TESTED: dict[str, str] = {"0.5.15": "CUDA (torch 2.11, H100/H200)", "0.5.23": "CPU (torch 2.13, CI)"}
#: kept for callers that list the tested builds.
SUPPORTED_VERSIONS: tuple[str, ...] = tuple(TESTED)


class UnsupportedSglangError(RuntimeError):
    """The installed SGLang is missing, outside the supported range, or its hooked internals have another shape."""


def parse(version: str) -> tuple[int, ...]:
    """The release part of ``version`` as numbers (``0.5.15.post1`` -> (0, 5, 15); local tags dropped)."""
    from packaging.version import Version

    return Version(version.split("+")[0]).release


def installed_sglang() -> str | None:
    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return None


def is_legacy(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed SGLang) has 0.5.15's internals rather than 0.5.23's: the
    scheduler reads its running batch from ``self`` (no ``running_batch`` argument), decoder layers take the
    residual instead of a ``capture_output`` callback, and no ``runtime_context.publish``."""
    from sglang.srt.managers.scheduler import Scheduler

    params = inspect.signature(Scheduler.get_next_batch_to_run).parameters
    return "running_batch" not in params


def check_supported_sglang() -> str:
    """Raise :class:`UnsupportedSglangError` unless an SGLang of the supported range is installed; return its
    version. Imports no SGLang (the launcher calls it before SGLang's own imports); where SGLang's scheduler is
    built, :func:`check_hook_shapes` follows.

    Called before the engine starts, so an unsupported version fails at start-up with the fix, never mid-serve
    inside a scheduler internal that moved.
    """
    version = installed_sglang()
    wanted = f"sglang>={OLDEST},<={NEWEST} (tested: " + ", ".join(f"{v} on {w}" for v, w in TESTED.items()) + ")"
    if version is None:
        raise UnsupportedSglangError(
            f"SGLang is not installed; install a supported build, {wanted}: `bash scripts/setup_sglang.sh` builds "
            f"a CPU environment (.venv-sglang, sglang=={NEWEST}); on a CUDA machine with torch 2.11 "
            f"benchmarks/gpu/prepare_sglang_h200.sh carries sglang=={OLDEST}")
    try:
        release = parse(version)
    except Exception:  # noqa: BLE001  (an unparsable version is outside the range as well)
        release = ()
    if not parse(OLDEST) <= release[:3] <= parse(NEWEST):
        raise UnsupportedSglangError(
            f"installed sglang=={version} is not supported by deltaserve_sglang: needs {wanted}; the adapter "
            "hooks scheduler internals that change between releases (docs/sglang-adapter.md)")
    return version


#: symbol -> (its parameters in 0.5.15, in 0.5.23). Each one is a hook target or an internal DeltaServe calls with
#: named arguments; ``check_hook_shapes`` accepts an installed SGLang whose parameter names match one of the two.
SHAPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run":
        (("self",), ("self", "running_batch", "last_batch")),
    "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw":
        (("self", "prefill_delayer_single_pass"), ("self", "prefill_delayer_single_pass", "running_batch")),
    "sglang.srt.managers.scheduler.Scheduler.run_batch": (("self", "batch", "pp_proxy_tensors"),) * 2,
    "sglang.srt.managers.scheduler.Scheduler.process_batch_result":
        (("self", "batch", "result"),) * 2,
    "sglang.srt.managers.scheduler.Scheduler.handle_generate_request":
        (("self", "recv_req"), ("self", "recv_req", "mm_input_error")),
    "sglang.srt.managers.scheduler.Scheduler.__init__":
        (("self", "server_args", "port_args", "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank", "attn_cp_rank",
          "moe_dp_rank", "dp_rank"), ("self", "server_args", "port_args")),
    "sglang.srt.managers.schedule_batch.ScheduleBatch.mix_with_running": (("self", "running_batch"),) * 2,
    "sglang.srt.managers.schedule_batch.ScheduleBatch.merge_batch": (("self", "other"),) * 2,
    "sglang.srt.models.llama.LlamaDecoderLayer.forward":
        (("self", "positions", "hidden_states", "forward_batch", "residual"),
         ("self", "positions", "hidden_states", "forward_batch", "capture_output")),
}


def _params(path: str) -> tuple[str, ...] | None:
    owner_path, attr = path.rsplit(".", 1)
    module_path, cls_name = owner_path.rsplit(".", 1)
    try:
        owner: Any = getattr(importlib.import_module(module_path), cls_name)
        fn = getattr(owner, attr)
        fn = inspect.unwrap(fn)
        return tuple(inspect.signature(fn).parameters)
    except Exception:  # noqa: BLE001  (moved or renamed: reported by the caller)
        return None


def check_hook_shapes() -> bool:
    """Compare every symbol of :data:`SHAPES` with the installed SGLang; return whether it has 0.5.15's shapes
    (``True``) or 0.5.23's (``False``). Raises :class:`UnsupportedSglangError` naming each symbol whose
    parameters match neither end, or a mix of both ends (a release between them that moved some but not all)."""
    legacy, problems = set(), []
    for path, (old, new) in SHAPES.items():
        got = _params(path)
        if got == old and got == new:
            continue
        if got == old:
            legacy.add(True)
        elif got == new:
            legacy.add(False)
        else:
            problems.append(f"{path}{got if got is not None else ' (missing)'}: expected {old} ({OLDEST}) or "
                            f"{new} ({NEWEST})")
    if len(legacy) > 1 and not problems:
        problems.append("its internals mix 0.5.15's and 0.5.23's shapes: "
                        + ", ".join(p for p, (o, n) in SHAPES.items() if o != n and _params(p) == o) + " have "
                        f"{OLDEST}'s")
    if problems:
        raise UnsupportedSglangError(
            f"installed sglang=={installed_sglang()} is inside the supported range but the internals DeltaServe "
            "hooks have another shape, so it refuses to start: " + "; ".join(problems)
            + " (docs/sglang-adapter.md, 'Supported versions')")
    return legacy == {True}
