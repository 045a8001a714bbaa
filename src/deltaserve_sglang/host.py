"""The SGLang host: :class:`HostHooks` and :class:`HostDriver` over an in-process SGLang ``Scheduler``.

SGLang normally runs its scheduler in a subprocess of ``sgl.Engine`` / ``sglang serve``. The driver path (tests,
conformance, demo, benchmarks) builds the same ``Scheduler`` in this process and runs its loop one iteration per
``step()`` (ingest -> ``get_next_batch_to_run`` -> ``run_batch`` -> ``process_batch_result``, the order of
SGLang's ``event_loop_normal``), so the core's interceptor and sinks are plain in-process objects, exactly as
with vLLM's in-process engine. The hooks themselves are the plugin's (:mod:`.plugin`), loaded through SGLang's
own ``load_plugins()`` and verified live before the host accepts work.

Devices: ``cpu`` (SGLang's CPU engine: torch-native attention and LoRA, every step eager; CI, SGLang 0.5.23) and
``cuda[:N]`` (SGLang 0.5.15 on the GPU machine; ``benchmarks/gpu/sglang_h200.sh``). On CUDA SGLang keeps its own
defaults for inference-only steps -- decode CUDA graphs and the prefill graph backend -- and a step that carries
fine-tuning rows runs eagerly (:func:`deltaserve_sglang.plugin.install_graph_guard`); each step's record says how
it ran (SGLang's ``can_run_cuda_graph``), and :meth:`SglangHost.graph_mode` predicts it from the step's shape.
The overlap scheduler stays off on the driver path (steps are driven one at a time; each one's duration is
device-complete).

``HostConfig.options`` (strings accepted):

- ``max_loaded_loras`` (default 16), ``max_loras_per_batch`` (default 4; one is the reserved adapter's).
- ``max_total_tokens`` (CPU default 65536): KV-cache tokens; on CUDA SGLang sizes the pool from
  ``mem_fraction_static`` unless this is given.
- ``enable_mixed_chunk`` (default true): SGLang's ``--enable-mixed-chunk`` (decode rows ride along in prefill
  steps). Reported as ``HostCapabilities.mixed_batches``; fine-tuning rows join decode steps either way
  (:meth:`deltaserve_sglang.binding.Binding._join`).
- CUDA only: ``attention_backend`` (default ``triton``: SGLang's own Triton kernels; the FA3 default on Hopper
  needs ``sgl_kernel.flash_ops``, which the GPU bundle leaves out, 560 MiB), ``sampling_backend`` (default
  ``pytorch``: flashinfer's sampler would JIT-compile on first use), ``lora_backend`` (default: SGLang's),
  ``mem_fraction_static`` (default 0.3 of the memory free at start, as SGLang 0.5.15 counts it: the backward
  process and other engines share the GPU), ``cuda_graph`` (default true; false = SGLang's
  ``--disable-cuda-graph``, every step eager), ``cuda_graph_backend_prefill`` / ``cuda_graph_backend_decode``
  (SGLang 0.5.15's ``--cuda-graph-backend-{prefill,decode}``: ``full``, ``breakable``, ``tc_piecewise``,
  ``disabled``; default SGLang's: ``breakable`` prefill and ``full`` decode on CUDA).
"""

from __future__ import annotations

import array
import itertools
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
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
    ActivationSink,
    ReservedAdapterError,
    ScheduleInterceptor,
    StepSink,
)
from deltaserve_core.hostkit import ProfileDraw, published_name
from deltaserve_core.types import (
    ExecutionMode,
    HostCapabilities,
    ModelSpec,
    ProfileShape,
    ProposedBatch,
    StepRecord,
)

from .binding import FINETUNE_RID_PREFIX, PROFILE_RID_PREFIX, Binding
from .launch import LORA_TARGETS, _flag
from .versions import check_hook_shapes, check_supported_sglang

__all__ = ["SglangHost"]

log = logging.getLogger("deltaserve.sglang")

_PROFILE_PREFIX = PROFILE_RID_PREFIX


class SglangHost:
    """DeltaServe host over SGLang. See the module docstring for options."""

    name = "sglang"

    def __init__(self, config: HostConfig) -> None:
        version = check_supported_sglang()
        cuda = config.device.startswith("cuda")
        if not cuda and config.device != "cpu":
            raise ValueError(f"device={config.device!r}: deltaserve_sglang drives SGLang on 'cpu' (its CPU engine) or "
                             "'cuda[:N]'")
        if not cuda:
            # Before SGLang is imported: its CPU engine is selected by environment.
            os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        opts = dict(config.options)
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import PortArgs, ServerArgs

        try:  # 0.5.23; 0.5.15 has neither (see below)
            from sglang.srt.runtime_context import SpawnRanks, publish
        except ImportError:
            SpawnRanks = publish = None  # noqa: N806

        from . import plugin

        # This process runs the scheduler itself: all hooks, also when SGLang loaded its plugins here already
        plugin.register(scheduler=True)
        load_plugins()  # SGLang's own plugin loading: runs deltaserve_sglang.plugin:register and applies hooks
        from sglang.srt.plugins.hook_registry import HookRegistry

        HookRegistry.apply_hooks()  # idempotent; applies what register() added after an earlier load_plugins()
        plugin.verify_hooks()
        legacy = check_hook_shapes()  # refuses a release whose hooked internals match neither tested end
        tokens = config.max_batch_tokens
        mixed = _flag(opts.get("enable_mixed_chunk", "true"))
        if cuda:
            gpu_id = int(config.device.partition(":")[2] or 0)
            device_args: dict[str, Any] = dict(
                device="cuda", base_gpu_id=gpu_id, attention_backend=str(opts.get("attention_backend", "triton")),
                sampling_backend=str(opts.get("sampling_backend", "pytorch")), grammar_backend="none",
                mem_fraction_static=float(opts.get("mem_fraction_static", 0.3)),
                disable_cuda_graph=not _flag(opts.get("cuda_graph", "true")))
            for key in ("lora_backend", "cuda_graph_backend_prefill", "cuda_graph_backend_decode"):
                if key in opts:  # SGLang's own settings, passed as given (SGLang validates them)
                    device_args[key] = str(opts[key])
            if "max_total_tokens" in opts:
                device_args["max_total_tokens"] = int(opts["max_total_tokens"])
        else:
            gpu_id = 0
            device_args = dict(device="cpu", attention_backend="torch_native", sampling_backend="pytorch",
                               lora_backend="torch_native", max_total_tokens=int(opts.get("max_total_tokens", 65536)))
        server_args = ServerArgs(
            model_path=str(config.model), dtype=config.dtype, random_seed=config.seed, skip_tokenizer_init=True,
            enable_lora=True, max_lora_rank=config.max_lora_rank,
            lora_target_modules=list(LORA_TARGETS),
            max_loras_per_batch=int(opts.get("max_loras_per_batch", 4)),
            max_loaded_loras=int(opts.get("max_loaded_loras", 16)),
            disable_overlap_schedule=True, enable_mixed_chunk=mixed, chunked_prefill_size=tokens,
            max_prefill_tokens=tokens, max_running_requests=config.max_running_requests, **device_args)
        port_args = PortArgs.init_new(server_args)
        from sglang.srt.managers.scheduler import Scheduler

        if legacy:
            # 0.5.15: ranks are constructor arguments (one process: all 0) and there is no runtime context
            scheduler = Scheduler(server_args, port_args, gpu_id, 0, 0, 0, 0, 0, None)
        else:
            publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=gpu_id))
            scheduler = Scheduler(server_args, port_args)
        self._attach(scheduler, config, version, legacy=legacy)
        for name, path in config.client_adapters.items():
            self.load_client_adapter(name, path)

    def _attach(self, scheduler: Any, config: HostConfig, version: str, *, legacy: bool | None = None) -> None:
        """Bind DeltaServe to a constructed SGLang ``Scheduler`` (this one's, or ``sglang serve``'s: .serving)."""
        import torch
        from transformers import AutoConfig

        from . import plugin

        self.config = config
        self._version = version
        self._tmp = make_temp_dir("sglang")
        self._live = InFlightRequests()
        self._inbox: list[Any] = []
        self._adapters: dict[str, str] = {}  # client-visible name -> SGLang lora_id
        self._withdrawn: dict[str, str] = {}  # lora_id -> name of retracted versions SGLang still holds
        self._ft_versions = itertools.count()
        self._ft_loaded: tuple[str, str] | None = None  # (lora_name, lora_id)
        self._finished: list[ClientOutput] = []
        # outputs of submit()ted requests that finished inside a generate() call: the next step() hands them out
        self._kept: list[ClientOutput] = []
        self._closed = False
        self._server_args = scheduler.server_args
        self._sched = scheduler
        self._binding = Binding(on_stream=self._on_stream)
        self._legacy = check_hook_shapes() if legacy is None else legacy
        self._binding.legacy = self._legacy
        runner = scheduler.tp_worker.model_runner
        self._runner = runner
        self._binding.num_layers = plugin.install_layer_capture(runner.model, self._binding)
        graphs = bool(plugin.install_graph_guard(runner, self._binding))
        if graphs:
            self._binding.model_runner = runner
            self._binding.graph_mode = self.graph_mode
        scheduler._deltaserve = self._binding
        plugin.STREAMERS[id(scheduler.output_streamer)] = self._binding
        self._torch = torch
        self._hf_config = AutoConfig.from_pretrained(config.model)
        mixed = bool(scheduler.is_mixed_chunk)
        self._capabilities = HostCapabilities(
            engine="sglang", engine_version=version,
            # With SGLang's mixed chunk a step holds prefill and decode rows; without it, one or the other.
            mixed_batches=mixed,
            graph_modes=frozenset({ExecutionMode.EAGER, ExecutionMode.GRAPH} if graphs else {ExecutionMode.EAGER}),
            activation_dtype=config.dtype,
            device=config.device, supports_abort=True, max_finetune_tokens_per_step=config.max_batch_tokens)

    # ------------------------------------------------------------------------------------ HostHooks

    def capabilities(self) -> HostCapabilities:
        return self._capabilities

    def model_spec(self) -> ModelSpec:
        cfg = self._hf_config
        return ModelSpec(path=str(self.config.model), architecture=(cfg.architectures or ["LlamaForCausalLM"])[0],
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                         dtype=self.config.dtype)

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        self._binding.interceptor = interceptor

    def capture_activation(self, sink: ActivationSink | None) -> None:
        self._binding.activation_sink = sink

    def report_step_time(self, sink: StepSink | None) -> None:
        self._binding.step_sink = sink

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        """SGLang's own decision (``ModelRunner._forward_raw``) for a step of this shape without fine-tuning rows.

        CPU (no CPU graph configured) or CUDA graphs off: eager. CUDA: a pure decode step replays the decode graph
        when its batch fits the captured sizes (``DecodeCudaGraphRunner.can_run_graph``: ``bs <= max_bs``, or a
        captured size exactly under ``--disable-cuda-graph-padding``); a step with prefill rows (SGLang's mixed
        chunk included: its forward mode counts as extend) replays the prefill graph when its token count fits
        (``PrefillCudaGraphRunner.can_run_graph``: ``num_tokens <= max_num_tokens``; the ``full`` backend also
        caps the rows). The step's record carries what SGLang actually did, so a disagreement shows there
        (conformance: graph_mode__agrees_with_execution)."""
        runner = getattr(self, "_runner", None)
        if runner is None or not batch.scheduled or ExecutionMode.GRAPH not in self._capabilities.graph_modes:
            return ExecutionMode.EAGER
        if not batch.has_prefill:
            graph = getattr(runner, "decode_cuda_graph_runner", None)
            if not _is_graph_runner(graph):
                return ExecutionMode.EAGER
            bs = batch.num_decode
            if getattr(graph, "disable_padding", False):
                fits = bs in set(getattr(graph, "capture_bs", ()) or ())
            else:
                fits = bs <= int(getattr(graph, "max_bs", 0) or 0)
            return ExecutionMode.GRAPH if fits else ExecutionMode.EAGER
        graph = getattr(runner, "prefill_cuda_graph_runner", None)
        if not _is_graph_runner(graph):
            return ExecutionMode.EAGER
        tokens = sum(batch.prefill_lengths) + batch.num_decode
        if tokens > int(getattr(graph, "max_num_tokens", 0) or 0):
            return ExecutionMode.EAGER
        if getattr(graph, "_is_full_backend", False) and len(batch.scheduled) > int(
                getattr(graph, "_capture_req_slots", 0) or 0):
            return ExecutionMode.EAGER
        return ExecutionMode.GRAPH

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        self._check_rank(state)
        path = self._tmp / "finetune" / f"v{next(self._ft_versions)}"
        state.save_pretrained(path)
        name = f"{RESERVED_ADAPTER_NAME}@{path.name}"
        lora_id = self._load_lora(name, str(path), pinned=True)
        previous = self._ft_loaded
        self._ft_loaded = (name, lora_id)
        self._binding.finetune_lora_id = lora_id
        if previous is not None:
            self._unload_lora(*previous)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A fresh name, folder and lora_id per version: SGLang's radix cache keys KV by lora_id, so KV computed
        # with older weights is never served under the new name.
        name = published_name(state.name, state.version)
        self._check_rank(state)
        path = self._published_path(name)
        state.save_pretrained(path)
        if name in self._adapters:  # the same name@version published again (a restarted job): new weights win
            self._unload_lora(name, self._adapters.pop(name))
        self._adapters[name] = self._load_lora(name, str(path), pinned=False)
        return name

    def retract_adapter(self, name: str) -> None:
        lora_id = self._adapters.pop(name, None)  # submit refuses it from now on (check_client_adapter)
        if lora_id is not None:
            self._withdrawn[lora_id] = name
            self._unload_withdrawn()

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        b = self._binding
        if shape.finetune_lengths and b.finetune_lora_id is None:
            # Refused before anything enters the engine: raised from inside a step, the throw-away requests already
            # prepared for it would keep their request slots and KV, and later steps would refuse rows within caps.
            raise RuntimeError(f"the profile shape {shape} has fine-tuning rows but no fine-tuning adapter is loaded: "
                               "SGLang runs them only on the reserved LoRA; call set_finetune_adapter first (deltaserve "
                               "calibrate loads a fresh one)")
        draw = ProfileDraw(shape, self._hf_config.vocab_size)
        run = f"{_PROFILE_PREFIX}{time.monotonic_ns()}"
        b.profiling, b.profile_record = True, None
        try:
            decodes = []
            context = max(1, shape.decode_context)
            # With the mixed chunk a row prefilled early decodes while later rows prefill (one token per step of
            # the warm-up): it needs tokens to spare, or it finishes before the profiled decode step (whenever the
            # rows' contexts take more than one prefill step; docs/sglang-adapter.md). SGLang caps what exceeds
            # its limit.
            warmup_steps = -(-shape.num_decode * context // max(1, self.config.max_batch_tokens)) + 1
            new_tokens = max(2, min(2 + warmup_steps, self._sched.max_req_len - 1 - context))
            for i in range(shape.num_decode):
                decodes.append(self._add(f"{run}-d{i}", draw.tokens(context), new_tokens, None, extra_key=run))
            for _ in range(10_000):  # warm-up: prefill the decode rows' contexts (steps never reported)
                if all(len(r.output_ids) >= 1 for r in self._reqs(decodes)) and not self._inbox:
                    break
                self._step_once()
            for i, n in enumerate(shape.prefill_lengths):
                # A radix-cache namespace per profile run: a repeated shape must not hit the KV of the previous one.
                self._add(f"{run}-p{i}", draw.tokens(n), 1, None, extra_key=run)
            b.profile_samples = draw.finetune_samples()
            b.idle_requested = True
            self._step_once()
            record = b.profile_record
            for _ in range(10_000):  # drain the throw-away requests
                if not any(r.rid.startswith(run) for r in self._all_reqs()) and not self._inbox:
                    break
                self._step_once()
        finally:
            b.profiling, b.profile_samples = False, None
        if record is None:
            raise RuntimeError(f"the profile step for {shape} did not run in one SGLang step (budget or KV cache "
                               "too small for that shape, or fine-tuning rows offered to a non-empty step)")
        return record

    # ------------------------------------------------------------------------------------ HostDriver

    def load_client_adapter(self, name: str, path: str) -> None:
        if name == RESERVED_ADAPTER_NAME or name.startswith(RESERVED_ADAPTER_NAME):
            raise ReservedAdapterError(name)
        self._adapters[name] = self._load_lora(name, path, pinned=False)

    def submit(self, request: ClientRequest) -> None:
        check_client_adapter(request, self._adapters)
        rid = request.request_id
        if rid in self._live or rid.startswith((_PROFILE_PREFIX, FINETUNE_RID_PREFIX)):
            raise ValueError(f"request id {rid!r} is already in flight or reserved")
        # SGLang aborts a prompt of max_req_input_len tokens or more, and silently lowers max_new_tokens to
        # max_req_len - prompt - 1 (Scheduler.init_req_max_new_tokens): refused here instead, so that an accepted
        # request always gets the tokens it asked for.
        n, s = len(request.prompt_ids), self._sched
        if n >= s.max_req_input_len or n + request.max_tokens > s.max_req_len - 1:
            raise ValueError(f"request {rid!r}: a prompt of {n} tokens with max_tokens={request.max_tokens} does not "
                             f"fit SGLang's limits (prompts under {s.max_req_input_len} tokens, prompt + max_tokens "
                             f"at most {s.max_req_len - 1}, from its context length and KV cache); shorten the "
                             "prompt or lower max_tokens")
        now = time.monotonic()
        self._add(rid, list(request.prompt_ids), request.max_tokens,
                  self._adapters[request.adapter] if request.adapter else None, ignore_eos=request.ignore_eos)
        self._binding.arrivals[rid] = (now, request.slo)
        self._live.add(request, now)
        if self._binding.interceptor is not None:
            self._binding.interceptor.on_arrival(rid, now)

    def has_unfinished(self) -> bool:
        # A finished request stays unfinished until step() has returned its output: the output stream drops it from
        # _live before the step's record reaches the core's step sink, which reads this answer.
        return bool(self._live) or bool(self._finished) or bool(self._kept)

    def step(self) -> list[ClientOutput]:
        self._step_once()
        done, self._finished = self._finished, []
        return take_kept(self._kept) + done

    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            return False
        self._binding.idle_requested = True
        self._binding.last_step_executed = False
        try:
            self._step_once()
        finally:
            self._binding.idle_requested = False
        return self._binding.last_step_executed

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return run_to_completion(self, requests, self._kept)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._kept.clear()
        sched = getattr(self, "_sched", None)
        if sched is not None:
            from . import plugin

            plugin.STREAMERS.pop(id(sched.output_streamer), None)
            sched._deltaserve = None
            self._sched = None  # type: ignore[assignment]
        shutil.rmtree(self._tmp, ignore_errors=True)

    # ------------------------------------------------------------------------------------ engine loop

    def _step_once(self) -> None:
        """One iteration of SGLang's ``event_loop_normal``, through its own methods (and so through the hooks)."""
        s = self._sched
        with self._torch.no_grad():
            inbox, self._inbox = self._inbox, []
            s.process_input_requests(inbox)
            if self._legacy:  # 0.5.15: the scheduler keeps its running batch itself
                batch = s.get_next_batch_to_run()
                s.cur_batch = batch
            else:
                plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
                s.running_batch = plan.running_batch
                batch = plan.batch_to_run
                s.cur_batch_for_debug = batch
            if batch:
                result = s.run_batch(batch)
                s.process_batch_result(batch, result)
            s.last_batch = batch
        self._unload_withdrawn()

    def _unload_withdrawn(self) -> None:
        """Unload retracted versions no request uses any more. SGLang looks a request's adapter up by its lora_id at
        every step it runs in, so one unloaded under a running request would fail that step."""
        if not self._withdrawn:
            return
        # a finished request stays in the running batch until the next step filters it out: it runs nothing more
        in_use = {r.lora_id for r in self._all_reqs() if not r.finished()} | {r.lora_id for r in self._inbox}
        for lora_id in [i for i in self._withdrawn if i not in in_use]:
            name = self._withdrawn.pop(lora_id)
            self._unload_lora(name, lora_id)
            shutil.rmtree(self._published_path(name), ignore_errors=True)

    def _on_stream(self, reqs: Sequence[Any]) -> None:
        now = time.monotonic()
        for req in reqs:
            # requests not submitted through this driver (to SGLang's server, on the operator path) are ignored
            result = self._live.update(req.rid, req.output_ids, now, req.finished())
            if result is not None:
                self._binding.arrivals.pop(req.rid, None)
                self._binding.token_times.forget(req.rid)
                self._finished.append(result)

    def _add(self, rid: str, prompt: list[int], max_tokens: int, lora_id: str | None, *,
             ignore_eos: bool = True, extra_key: str | None = None) -> str:
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
        params.normalize(None)
        params.verify(self._hf_config.vocab_size)
        self._inbox.append(TokenizedGenerateReqInput(
            rid=rid, input_text="", input_ids=array.array("q", prompt), input_embeds=None, mm_inputs=None,
            token_type_ids=None, sampling_params=params, return_logprob=False, logprob_start_len=-1,
            top_logprobs_num=0, token_ids_logprob=None, stream=True, lora_id=lora_id, extra_key=extra_key))
        return rid

    def _all_reqs(self) -> list[Any]:
        s = self._sched
        reqs = list(s.waiting_queue)
        if s.running_batch is not None:
            reqs += list(s.running_batch.reqs)
        # A prefill step's requests join the running batch only when the next step is formed.
        if s.last_batch is not None and s.last_batch is not s.running_batch:
            seen = {id(r) for r in reqs}
            reqs += [r for r in s.last_batch.reqs if id(r) not in seen and not r.finished()]
        return reqs

    def _reqs(self, rids: Sequence[str]) -> list[Any]:
        wanted = set(rids)
        found = [r for r in self._all_reqs() if r.rid in wanted]
        return found if len(found) == len(wanted) else [_Pending()]

    def _load_lora(self, name: str, path: str, *, pinned: bool) -> str:
        from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput

        lora_id = uuid.uuid4().hex
        result = self._sched.load_lora_adapter(LoadLoRAAdapterReqInput(lora_name=name, lora_path=str(path),
                                                                       pinned=pinned, lora_id=lora_id))
        if not result.success:
            raise RuntimeError(f"SGLang could not load LoRA adapter {name!r} from {path}: {result.error_message}")
        return lora_id

    def _unload_lora(self, name: str, lora_id: str) -> None:
        from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

        result = self._sched.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=name, lora_id=lora_id))
        if not result.success:  # nothing can use it any more (its name is gone): only its memory stays taken
            log.warning("SGLang could not unload LoRA adapter %s: %s", name, result.error_message)

    def _published_path(self, name: str) -> Path:
        return self._tmp / "published" / name.replace("/", "_")

    def _check_rank(self, state: LoraAdapterState) -> None:
        if state.config.r > self.config.max_lora_rank:
            raise ValueError(f"adapter {state.name!r} has rank {state.config.r} > max_lora_rank="
                             f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")


def _is_graph_runner(runner: Any) -> bool:
    """A CUDA-graph runner SGLang may replay (not its eager stand-in, not absent)."""
    return runner is not None and hasattr(runner, "can_run_graph") and type(runner).__name__ != "EagerRunner"


class _Pending:
    """Stands for a request SGLang has not admitted yet (no output ids)."""

    output_ids: tuple[int, ...] = ()
