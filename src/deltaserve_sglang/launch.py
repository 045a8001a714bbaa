"""SGLang's own server command (``python -m sglang.launch_server``) with DeltaServe switched on.

:func:`operator_command` is what ``deltaserve calibrate --host sglang`` prints and ``deltaserve serve --host sglang``
runs (through ``HostSpec.operator_command``). A stored profile holds for the steps it measured, so the server runs
with the engine settings :class:`~deltaserve_sglang.host.SglangHost` calibrated under: the same per-step token
budget (chunked-prefill size), LoRA target modules, rank, mixed chunk and device backends. SGLang has no per-plugin
settings, so the switch is ``DELTASERVE_JOB`` in the environment (docs/sglang-adapter.md, "Operator path").
Importing this module imports nothing of SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence

from deltaserve_core.driver import HostConfig
from deltaserve_core.registry import ServerCommand

__all__ = ["LORA_TARGETS", "operator_command"]

#: the LoRA layers SGLang builds for DeltaServe (SglangHost and the server line alike): a job may target any of
#: them, and one created over HTTP later may too
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _flag(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def operator_command(config: HostConfig, job_path: str, *, listen: tuple[str, int] | None = None,
                     api_key: str | None = None, jobs_api: bool = False, extra: Sequence[str] = ()) -> ServerCommand:
    """``sglang.launch_server`` for ``config`` with the job file ``job_path``; the keywords as
    :class:`~deltaserve_core.registry.HostSpec` describes them.

    The jobs routes are mounted whenever DeltaServe is switched on (``jobs_api`` changes nothing). SGLang reads
    its key from ``--api-key`` only, so the key is on the command line: visible in ``ps`` to the machine's other
    users (docs/security.md)."""
    del jobs_api
    opts = dict(config.options)
    cuda = str(config.device).startswith("cuda")
    tokens = str(config.max_batch_tokens)
    words = ["python", "-m", "sglang.launch_server", "--model-path", str(config.model), "--dtype", str(config.dtype),
             "--enable-lora", "--max-lora-rank", str(config.max_lora_rank), "--lora-target-modules", *LORA_TARGETS,
             "--max-loras-per-batch", str(opts.get("max_loras_per_batch", 4)),
             "--disable-overlap-schedule", "--chunked-prefill-size", tokens, "--max-prefill-tokens", tokens]
    if _flag(opts.get("enable_mixed_chunk", "true")):
        words.append("--enable-mixed-chunk")
    env = {"DELTASERVE_JOB": job_path}
    if cuda:
        words += ["--base-gpu-id", str(config.device).partition(":")[2] or "0",
                  "--attention-backend", str(opts.get("attention_backend", "triton")),
                  "--sampling-backend", str(opts.get("sampling_backend", "pytorch")),
                  "--mem-fraction-static", str(opts.get("mem_fraction_static", 0.3))]
        if "max_total_tokens" in opts:
            words += ["--max-total-tokens", str(opts["max_total_tokens"])]
    else:
        # SGLang's CPU engine is chosen by environment before it is imported; these backends are the ones its CPU
        # path runs (the calibration host's)
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        words += ["--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
                  "--lora-backend", "torch_native", "--max-total-tokens", str(opts.get("max_total_tokens", 65536))]
    if listen is not None:
        words += ["--host", listen[0], "--port", str(listen[1])]
    secret: frozenset[int] = frozenset()
    if api_key is not None:
        words += ["--api-key", api_key]
        secret = frozenset({len(words) - 1})
    words += list(extra)
    return ServerCommand(tuple(words), env, secret_argv=secret)
