"""vLLM as shipped, without DeltaServe: the engine the bench's ``stock`` systems run.

An operator compares DeltaServe with the vLLM they would run anyway, so the inference tax is measured against it,
on the same GPU, arrivals and lengths:

- ``stock``: vLLM's own defaults (torch.compile, its default CUDA-graph mode and model runner, async scheduling
  where the platform turns it on, prefix caching) with only what an operator serving DeltaServe's adapters sets
  as well: model, dtype, seed, token budget, running-request cap, memory share, and LoRA on with the same rank and
  slots (published adapters are LoRAs);
- ``stock_ds_config``: unmodified vLLM given DeltaServe's engine settings (:func:`.host.engine_settings`), so that
  the cost of the configuration and the cost of the hooks are told apart;
- ``served``: DeltaServe as an operator runs it, ``vllm serve``'s engine with the ``deltaserve`` plugin and a job
  (``stock``'s arguments plus ``additional_config``; the plugin adds what co-serving needs), so the tax is measured
  on the operator's path rather than on the bench's in-process driver;
- ``served_paused``: the same with its job paused before the first request: DeltaServe's scheduler, worker
  extension, executor and reserved LoRA slot in place, nothing trained (the tax of the configuration alone).

Each variant runs in a child process of its own: vLLM's defaults include the multiprocess engine core, and the
in-process host's environment (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) must not reach it; DeltaServe's vLLM plugin loads in the ``served`` variants only. Clients are served through ``AsyncLLM``, the
engine under ``vllm serve``; a token's time is when the client's stream receives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deltaserve_core.bench.metrics import saturation_summary
from deltaserve_core.driver import ClientRequest, HostConfig

__all__ = ["SERVED_VARIANTS", "VARIANTS", "run_stock", "stock_engine_args"]

VARIANTS = ("stock", "stock_ds_config", "served", "served_paused")
#: the variants that run DeltaServe's plugin with a job (``run_stock``'s ``job``)
SERVED_VARIANTS = ("served", "served_paused")
#: requests served before the timed part (kernels built lazily on first use, allocator growth)
_WARMUP = 4


def stock_engine_args(config: HostConfig, variant: str, *, cuda: bool, job_path: str | None = None) -> dict[str, Any]:
    """Engine arguments of ``variant`` (see the module docstring); ``job_path``: the job file of a served variant."""
    from .host import _async_scheduling, engine_settings

    if variant in SERVED_VARIANTS:
        if not job_path:
            raise ValueError(f"the {variant!r} variant runs DeltaServe's plugin, which needs a job config file")
        kwargs = stock_engine_args(config, "stock", cuda=cuda)
        # What the operator adds to the stock line: the job, and the scheduling loop DeltaServe was calibrated in
        # (the stored profile is per loop; an explicit async_scheduling host option must reach this engine too).
        kwargs["additional_config"] = {"deltaserve": {"job": job_path}}
        kwargs["async_scheduling"] = _async_scheduling(config.options.get("async_scheduling"), cuda)
        return kwargs
    if variant == "stock_ds_config":  # the host's settings under the host's options, async scheduling included
        return engine_settings(config, cuda=cuda,
                               async_scheduling=_async_scheduling(config.options.get("async_scheduling"), cuda))
    if variant != "stock":
        raise ValueError(f"unknown stock variant {variant!r}; choose from {', '.join(VARIANTS)}")
    opts = config.options
    kwargs: dict[str, Any] = {
        "model": config.model, "dtype": config.dtype, "seed": config.seed,
        "max_num_batched_tokens": config.max_batch_tokens, "max_num_seqs": config.max_running_requests,
        "enable_lora": True, "max_lora_rank": config.max_lora_rank,
        "max_loras": int(opts.get("max_loras", 4)), "max_cpu_loras": int(opts.get("max_cpu_loras", 16)),
    }
    if "gpu_memory_utilization" in opts:
        kwargs["gpu_memory_utilization"] = float(opts["gpu_memory_utilization"])
    if "block_size" in opts:
        kwargs["block_size"] = int(opts["block_size"])
    return kwargs


def _child_env(variant: str, cuda: bool, profile_dir: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # the in-process host's own setting; an operator's VLLM_USE_V2_MODEL_RUNNER reaches every variant alike
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if variant in SERVED_VARIANTS:
        env["VLLM_PLUGINS"] = "deltaserve"  # only DeltaServe's engine plugin, as `vllm serve` would load it
        if profile_dir:
            env["DELTASERVE_PROFILE_DIR"] = profile_dir  # where the bench stored this engine's calibration
    else:
        # No general plugin: DeltaServe's would be a no-op without its config, but "stock" means nothing of ours loads.
        env["VLLM_PLUGINS"] = "__none__"
    return env


def run_stock(variant: str, config: HostConfig, arrivals: Sequence[tuple[float, ClientRequest]], *,
              saturation: Sequence[ClientRequest] = (), timeout_s: float = 1800.0,
              log_path: str | os.PathLike[str] | None = None, job: Mapping[str, Any] | None = None,
              profile_dir: str | None = None) -> dict[str, Any]:
    """Serve ``arrivals`` ((seconds, request), sorted) on vLLM ``variant`` in a child process, in real time.

    Returns ``{"token_times": [[s, ...] per arrival], "saturation": {...} or None, "engine": {...},
    "startup_s": s}``, and for the served variants ``"job"``: the job's status (OpenAI's fine-tuning job object)
    at the replay's start and end and after the saturation run; token times are seconds from the replay's start. ``saturation``: requests served all at once
    after the replay (throughput at saturation). ``job`` (served variants): the job config mapping
    (:func:`deltaserve_core.job_config.job_config_to_mapping`); ``profile_dir``: the calibration store the served
    engine reads. Raises ``RuntimeError`` with the child's log tail when it fails."""
    cuda = config.device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="deltaserve-stock-") as tmp:
        job_path = None
        if variant in SERVED_VARIANTS:
            if job is None:
                raise ValueError(f"the {variant!r} variant needs the job to co-serve (run_stock's job)")
            import yaml

            job_path = str(Path(tmp) / "job.yaml")
            Path(job_path).write_text(yaml.safe_dump(dict(job)))
        spec = {
            "variant": variant, "cuda": cuda,
            "engine_args": stock_engine_args(config, variant, cuda=cuda, job_path=job_path),
            "arrivals": [[t, list(r.prompt_ids), r.max_tokens] for t, r in arrivals],
            "saturation": [[list(r.prompt_ids), r.max_tokens] for r in saturation],
            "host_config": {k: v for k, v in asdict(config).items() if k in ("model", "device", "dtype")},
        }
        req, out = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(spec))
        log = Path(log_path) if log_path is not None else Path(tmp) / "child.log"
        with open(log, "w") as fh:
            try:
                proc = subprocess.run([sys.executable, "-m", __name__, str(req), str(out)],
                                      env=_child_env(variant, cuda, profile_dir),
                                      stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
                code: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                code = f"timeout after {timeout_s:.0f} s"
        if code != 0 or not out.exists():
            tail = log.read_text(errors="replace").splitlines()[-25:]
            raise RuntimeError(f"vLLM {variant} (child process) failed ({code}):\n" + "\n".join(tail))
        return json.loads(out.read_text())


# ------------------------------------------------------------------------------------------------ child process


def _engine_facts(engine: Any) -> dict[str, Any]:
    """What the engine actually runs with (vLLM settles several defaults while it builds its config)."""
    import vllm

    facts: dict[str, Any] = {"vllm": vllm.__version__}
    cfg = getattr(engine, "vllm_config", None)
    if cfg is None:
        return facts
    comp, sched, cache = cfg.compilation_config, cfg.scheduler_config, cfg.cache_config
    facts.update(compilation_mode=str(getattr(comp, "mode", None)),
                 cudagraph_mode=str(getattr(comp, "cudagraph_mode", None)),
                 async_scheduling=bool(getattr(sched, "async_scheduling", False)),
                 prefix_caching=bool(getattr(cache, "enable_prefix_caching", False)),
                 enforce_eager=bool(getattr(cfg.model_config, "enforce_eager", False)))
    from vllm.engine.arg_utils import EngineArgs

    from .plugin import _MARK

    # the proof that nothing of DeltaServe's ran in this engine (its plugin wraps this method when it loads)
    facts["deltaserve_plugin_loaded"] = bool(getattr(EngineArgs.create_engine_config, _MARK, False))
    try:
        from vllm import envs

        facts["v2_model_runner"] = bool(envs.VLLM_USE_V2_MODEL_RUNNER)
    except AttributeError:  # a vLLM without the switch has one runner
        facts["v2_model_runner"] = None
    return facts


async def _serve(engine: Any, jobs: Sequence[tuple[float, list[int], int]], tag: str) -> tuple[list[list[float]], float]:
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    t0 = time.monotonic()

    async def one(i: int, t: float, prompt: list[int], max_tokens: int) -> list[float]:
        delay = t0 + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.DELTA)
        times: list[float] = []
        async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, f"{tag}-{i}"):
            now = time.monotonic() - t0
            times.extend([now] * len(out.outputs[0].token_ids))
        return times

    got = await asyncio.gather(*(one(i, t, p, n) for i, (t, p, n) in enumerate(jobs)))
    return list(got), time.monotonic() - t0


async def _job_call(engine: Any, op: str, **args: Any) -> dict[str, Any]:
    """One jobs-API call into the EngineCore (as the jobs routes of ``vllm serve`` make it); the job's answer.

    The runtime starts with the engine's scheduler, so the job may not have started yet: retried for a while."""
    deadline = time.monotonic() + 120.0
    while True:
        answers = await engine.collective_rpc("deltaserve_job_call", args=(op, args))
        answer = answers[0] if isinstance(answers, list) else answers
        if "result" in answer:
            return answer["result"]
        if answer.get("status") != 503 or time.monotonic() > deadline:
            raise RuntimeError(f"DeltaServe job call {op!r} failed: {answer.get('error')}")
        await asyncio.sleep(0.5)


async def _settled(engine: Any, job_id: str, timeout_s: float = 120.0) -> None:
    """Wait until a paused job's backward has finished what it captured before the pause (an idle engine admits
    fine-tuning from its first second), so that nothing is trained while the paused system is measured."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        status = await _job_call(engine, "get", id=job_id)
        now = (status["trained_tokens"], status["deltaserve"]["backward_busy"])
        if now == last and not now[1]:
            return
        last = now
        await asyncio.sleep(1.0)
    raise RuntimeError(f"the paused job's backward did not settle within {timeout_s:.0f} s")


async def _child(spec: dict[str, Any]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t = time.monotonic()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec["engine_args"]))
    served = spec["variant"] in SERVED_VARIANTS
    try:
        startup = time.monotonic() - t
        job_id = None
        if served:
            job_id = (await _job_call(engine, "list"))[0]["id"]
            if spec["variant"] == "served_paused":
                await _job_call(engine, "pause", id=job_id)
                await _settled(engine, job_id)
        arrivals = [(float(a), list(p), int(n)) for a, p, n in spec["arrivals"]]
        # reversed prompts: the same shapes, no prefix-cache hit for the replay that follows
        warm = [(0.0, p[::-1], 4) for _, p, _ in arrivals[:_WARMUP]]
        if warm:
            await _serve(engine, warm, "warm")
        job_trace: list[dict[str, Any]] = []  # the job's status at the replay's start and end (served variants)
        if served:
            job_trace.append(await _job_call(engine, "get", id=job_id))
        times, _ = await _serve(engine, arrivals, "r")
        if served:
            job_trace.append(await _job_call(engine, "get", id=job_id))
        sat = None
        if spec["saturation"]:
            jobs = [(0.0, list(p), int(n)) for p, n in spec["saturation"]]
            stimes, _ = await _serve(engine, jobs, "sat")
            sat = saturation_summary(stimes, sum(len(p) for _, p, _ in jobs))
        result = {"token_times": times, "saturation": sat, "engine": _engine_facts(engine), "startup_s": startup}
        if served:
            result["job"] = {"replay_start": job_trace[0], "replay_end": job_trace[1],
                             "end": await _job_call(engine, "get", id=job_id)}
        return result
    finally:
        engine.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m deltaserve_vllm.stock REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    result = asyncio.run(_child(spec))
    tmp = Path(args[1]).with_suffix(".part")
    tmp.write_text(json.dumps(result))
    tmp.replace(args[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
