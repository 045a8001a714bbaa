"""The S-LoRA host: :class:`HostHooks` + :class:`HostDriver` over an in-process S-LoRA router (TP=1).

S-LoRA's own launcher runs the router in a child process with a ZMQ link to an HTTP server and a detokenizer; with
TP=1 its ``RouterManager`` drives a ``ModelRpcServer`` in the same process (``start_model_process`` returns an
in-process client). This host builds that router itself, applies :mod:`.patches`, and steps ``router._step()`` on
its own event loop. The detokenizer link is replaced by the driver's output collector (tokens, not text): every
token S-LoRA sends to the output stage arrives there, so a fine-tuning row leaking past the filter would show up
as a client output.

``HostConfig.options`` (strings accepted, as from ``--host-option``):

- ``slora_path``: the S-LoRA checkout (else ``$DELTASERVE_SLORA_PATH``, else an importable ``slora``).
- ``max_total_token_num`` (default 8192): KV-pool tokens; ``pool_size_lora`` (default 4096): extra pool cells for
  adapter rows (S-LoRA's unified paging).
- ``work_dir``: where the fp16/MHA model copy and adapter folders go (default a temporary folder).

The :class:`HostHooks` half is :class:`SloraHooks`, shared with the operator path (:mod:`.launch`, S-LoRA's own
API server with DeltaServe in its router process); :class:`SloraHost` adds the driver.

S-LoRA runs fp16 on CUDA only (its kernels and ``exposed_add_batch`` accept fp16 only): other dtypes/devices are
refused. A fine-tuning-only step stops at the next decoder-layer boundary when the activation sink's
``should_abort`` says so (a client request arrived; :mod:`.patches`, the ``_context_forward`` wrap): its samples are
reported aborted in the step's record and S-LoRA retires the rows as after any step. Grouped-query models are
served as their exact MHA expansion (:mod:`.layout`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltaserve_core.adapter_state import LoraAdapterState, LoraConfigSpec
from deltaserve_core.driver import (
    ClientOutput,
    ClientRequest,
    HostConfig,
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

from . import layout
from .locate import SloraCheckout, activate, locate_slora
from .patches import FINETUNE_REQUEST_PREFIX, Channel, install, note_arrival, recover, uninstall

__all__ = ["SloraHooks", "SloraHost", "engine_version"]

log = logging.getLogger("deltaserve.slora")

_PROFILE_PREFIX = "__deltaserve_profile__"


@dataclass
class _Live:
    request: ClientRequest
    arrival: float
    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


class _OutputCollector:
    """Stands where S-LoRA's detokenizer socket was: receives ``BatchTokenIdOut`` objects (``send_pyobj``)."""

    def __init__(self) -> None:
        self.finished: list[ClientOutput] = []
        self.live: dict[str, _Live] = {}
        self.strays: dict[str, _Live] = {}

    def send_pyobj(self, obj: Any) -> None:
        infs = getattr(obj, "reqs_infs", None)
        if infs is None:
            return  # request-state / abort messages: the detokenizer's bookkeeping, no tokens
        now = time.monotonic()
        for rid, token, _meta, finished, _aborted in infs:
            live = self.live.get(rid)
            if live is None:
                if rid.startswith(_PROFILE_PREFIX):
                    continue  # calibration rows: the host's own throw-away requests
                # Anything else is an output no client asked for: surfaced, never dropped.
                live = self.strays.setdefault(rid, _Live(ClientRequest(rid, (0,), 1), now))
            live.tokens.append(int(token))
            live.times.append(now)
            if finished:
                self.live.pop(rid, None)
                self.strays.pop(rid, None)
                self.finished.append(ClientOutput(rid, tuple(live.tokens), live.arrival, live.times[0], live.times[-1],
                                                  tuple(live.times)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_version(checkout: SloraCheckout) -> str:
    """The engine version a calibration profile is keyed by (``ProfileKey.engine_version``); the same for the
    in-process host and the operator path, so one ``deltaserve calibrate --host slora`` serves both."""
    return (checkout.commit or "c1ddf48-equivalent")[:12]


class SloraHooks:
    """:class:`~deltaserve_core.hooks.HostHooks` over a live S-LoRA router (TP=1) with :mod:`.patches` applied.

    The translation between the core and S-LoRA lives here once, for both ways S-LoRA runs: :class:`SloraHost`
    (this process builds and steps the router) and :mod:`.launch` (S-LoRA's own API server steps its router in
    the router process). Set up in two phases because :class:`SloraHost` must write adapter folders before the
    router exists: :meth:`_init_hooks`, then :meth:`_attach` once the router's ``ModelRpcServer`` is ready."""

    name = "slora"

    def _init_hooks(self, *, checkout: SloraCheckout, model_path: str, served_dir: Path, work_dir: Path,
                    device: str, max_lora_rank: int, max_batch_tokens: int,
                    publish_dir: Path | None = None) -> None:
        """``model_path``: the checkpoint as the operator named it (model spec, profile key, GQA shapes);
        ``served_dir``: the (MHA, fp16) folder S-LoRA loaded; ``publish_dir``: where published versions go
        (default: ``work_dir``)."""
        self.checkout = checkout
        self._spec_path = model_path
        self._model_dir = Path(served_dir)
        self._cfg = json.loads((self._model_dir / "config.json").read_text())
        self._hf_cfg = json.loads((Path(model_path) / "config.json").read_text())
        self._tmp = Path(work_dir)
        self._publish_dir = Path(publish_dir) if publish_dir is not None else self._tmp / "adapters"
        self._max_lora_rank = max_lora_rank
        self._dirs = itertools.count()
        self._adapters: dict[str, str] = {}  # client-visible name -> S-LoRA adapter dir
        #: published version name -> the S-LoRA adapter folder serving it (a client's ``lora_dir``)
        self.published_dirs: dict[str, str] = {}
        self._retired: set[str] = set()  # S-LoRA folders of withdrawn versions: registered, no longer served
        self.channel = Channel()
        self._capabilities = HostCapabilities(
            engine="slora", engine_version=engine_version(checkout), mixed_batches=False,
            graph_modes=frozenset({ExecutionMode.EAGER}), activation_dtype="float16", device=device,
            supports_abort=True, max_finetune_tokens_per_step=max_batch_tokens)

    def _attach(self, router: Any, zero_dir: str | None = None) -> None:
        """Bind the ready router and apply the patches. ``zero_dir``: the all-zero adapter of the base-request fix
        when S-LoRA already loaded it at start-up; otherwise it is written and registered here."""
        self.router = router
        self.server = router.model_rpcs[0].model
        if zero_dir is None:
            zero_dir = self._write_adapter(self._zero_state(8), "zero")
            self._register(zero_dir)
        self.channel.zero_dir = zero_dir
        self.installed = install(self.router, self.server, self.channel)

    # ------------------------------------------------------------------------------------ adapters

    def _zero_state(self, r: int) -> LoraAdapterState:
        import torch

        hidden, layers = int(self._cfg["hidden_size"]), int(self._cfg["num_hidden_layers"])
        kv_out = int(self._hf_cfg.get("num_key_value_heads") or self._hf_cfg["num_attention_heads"]) * (
            hidden // int(self._hf_cfg["num_attention_heads"]))
        tensors = {}
        for li in range(layers):
            for m in layout.SLORA_MODULES:
                out = kv_out if m in ("k_proj", "v_proj") else hidden
                p = f"base_model.model.model.layers.{li}.self_attn.{m}"
                tensors[f"{p}.lora_A.weight"] = torch.zeros(r, hidden)
                tensors[f"{p}.lora_B.weight"] = torch.zeros(out, r)
        return LoraAdapterState("deltaserve-zero", 0, LoraConfigSpec(r=r, lora_alpha=float(r)), tensors)

    def _write_adapter(self, state: LoraAdapterState, name: str, root: Path | None = None) -> str:
        d = (root or self._tmp / "adapters") / layout.slora_dir_name(name, next(self._dirs))
        layout.write_slora_adapter(state, self._hf_cfg, d)
        return str(d)

    def _register(self, directory: str) -> None:
        """Make an adapter folder known to a running S-LoRA (its router and ModelRpcServer only read them at init)."""
        from slora.models.peft.lora_adapter import LoraTpPartAdapter
        from slora.utils.model_utils import get_model_config

        adapter = LoraTpPartAdapter(0, 1, directory, get_model_config(str(self._model_dir)), swap=True, dummy=False,
                                    no_lora_swap=False, prefetch_stream=None)
        self.server.adapter_id[directory] = len(self.server.adapters)
        self.server.adapters.append(adapter)
        self.router.lora_ranks[directory] = adapter.r

    def _write_rows(self, directory: str, state: LoraAdapterState) -> None:
        """Put ``state`` into an adapter's host copy and, when it sits in the KV pool, into its pool rows."""
        import torch

        adapter = self.server.adapters[self.server.adapter_id[directory]]
        rows = layout.pool_rows(state, self._hf_cfg)
        for layer, block in zip(adapter.layers, rows):
            layer.w_combined_home.copy_(block)
        ia = self.server.infer_adapter
        idx = ia.idx_map.get(directory)
        if idx is not None:
            start, n = int(ia.a_start[idx]), int(ia.a_len[idx])
            loc = ia.a_loc[start:start + n]
            mm = self.server.model.mem_manager
            for li, block in enumerate(rows):
                mm.key_buffer[li][loc] = block[0].to(mm.key_buffer[li].device)
                mm.value_buffer[li][loc] = block[1].to(mm.value_buffer[li].device)
            torch.cuda.synchronize()

    def _check_rank(self, state: LoraAdapterState) -> None:
        if state.config.r > self._max_lora_rank:
            raise ValueError(f"adapter {state.name!r} has rank {state.config.r} > max_lora_rank="
                             f"{self._max_lora_rank}")

    # ------------------------------------------------------------------------------------ HostHooks

    def capabilities(self) -> HostCapabilities:
        return self._capabilities

    def model_spec(self) -> ModelSpec:
        cfg = self._hf_cfg
        return ModelSpec(path=self._spec_path, architecture=(cfg.get("architectures") or ["LlamaForCausalLM"])[0],
                         num_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]),
                         vocab_size=int(cfg["vocab_size"]), dtype="float16")

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        self.channel.interceptor = interceptor

    def capture_activation(self, sink: ActivationSink | None) -> None:
        self.channel.activation_sink = sink

    def report_step_time(self, sink: StepSink | None) -> None:
        self.channel.step_sink = sink

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return ExecutionMode.EAGER  # S-LoRA has no CUDA graphs

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        self._check_rank(state)
        key = f"{RESERVED_ADAPTER_NAME}/r{state.config.r}"
        directory = self._adapters.get(key)
        if directory is None:  # first load (or a new rank): a folder S-LoRA's loader reads, registered at run time
            directory = self._write_adapter(state, "finetune")
            self._register(directory)
            self._adapters[key] = directory
        self._write_rows(directory, state)  # in place: later steps' rows use exactly these weights
        self.channel.reserved_dir = directory

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A fresh name and adapter entry per version: S-LoRA has no prefix cache, and older versions stay servable.
        self._check_rank(state)
        name = published_name(state.name, state.version)
        # The folder only tells S-LoRA's loader the rank and scaling (lora_alpha / r); its rows are then written from
        # `state` by layout.pool_rows, so what clients get is this transform's output, checked by conformance.
        zero = self._zero_state(state.config.r)
        zero = LoraAdapterState(name, state.version, state.config, zero.tensors, state.base_model_path)
        directory = self._write_adapter(zero, name, self._publish_dir)
        self._register(directory)
        self._write_rows(directory, state)
        self._adapters[name] = directory
        self.published_dirs[name] = directory
        log.info("published adapter %s: request it with \"lora_dir\": %r (or %r)", name, directory, name)
        return name

    def retract_adapter(self, name: str) -> None:
        """Withdraw a published version: new requests for it are refused. S-LoRA keeps the adapter registered
        (queued requests may still run on it; it read the folder at registration), and its folder is marked
        retired, so the core deletes it with the version's durable copy."""
        directory = self.published_dirs.pop(name, None)
        if directory is None:
            raise KeyError(f"adapter {name!r} is not published on this host")
        # the driver's submit looks names up here: a version left in it would still be accepted
        self._adapters.pop(name, None)
        from deltaserve_core.coserve import RETIRED_MARK

        self._retired.add(directory)
        (Path(directory) / RETIRED_MARK).touch()

    def client_adapter_dir(self, requested: str | None) -> str | None:
        """The S-LoRA folder that serves a client's ``lora_dir``: a folder S-LoRA knows, or a published version by
        its name (``served@v7``) or its durable copy (``<checkpoint dir>/published/served@v7``); None (base) stays
        None. Raises ``LookupError`` for anything else: an unknown folder, a withdrawn version, the reserved
        fine-tuning adapter."""
        if requested is None:
            return None
        reserved = {d for k, d in self._adapters.items() if k.startswith(f"{RESERVED_ADAPTER_NAME}/")}
        if requested in reserved or requested in self._retired:
            raise LookupError(f"lora_dir {requested!r} is not served (the fine-tuning adapter or a withdrawn "
                              f"version); published now: {sorted(self.published_dirs)}")
        if requested in self.router.lora_ranks:
            return requested
        path = Path(requested)
        name = requested if requested in self.published_dirs else path.name
        if name in self.published_dirs and (name == requested or path.parent.resolve() == self._publish_dir.resolve()):
            return self.published_dirs[name]
        raise LookupError(f"lora_dir {requested!r} is neither a folder this S-LoRA serves nor a published version; "
                          f"request one of {sorted(self.published_dirs)} (by name or its folder under "
                          f"{self._publish_dir}) or an adapter given to --lora-dirs")

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        raise RuntimeError("calibration cannot run inside S-LoRA's own server (its router loop owns the steps); run "
                           f"`deltaserve calibrate --host slora --model {self._spec_path} --device cuda --dtype "
                           "float16` before starting it: it stores the profile the server loads")


class SloraHost(SloraHooks):
    """DeltaServe host over stock S-LoRA (see the module docstring)."""

    def __init__(self, config: HostConfig) -> None:
        if not config.device.startswith("cuda") or config.dtype != "float16":
            raise ValueError(f"S-LoRA runs fp16 on CUDA only (its kernels and InferBatch accept fp16): start the "
                             f"slora host with device=cuda, dtype=float16 (got {config.device}, {config.dtype})")
        opts = dict(config.options)
        checkout = locate_slora(opts.get("slora_path"))
        activate(checkout)

        import torch.distributed as dist
        if dist.is_initialized():
            raise RuntimeError("deltaserve_slora: torch.distributed is already initialised in this process; S-LoRA's "
                               "ModelRpcServer initialises it itself (one S-LoRA host per process)")
        from slora.common.configs.config import setting
        from slora.server.input_params import InputParams
        from slora.server.router.manager import RouterManager

        self.config = config
        tmp = Path(opts.get("work_dir") or tempfile.mkdtemp(prefix="deltaserve-slora-"))
        model_dir, _ = layout.write_mha_checkpoint(Path(config.model), tmp / "model")
        self._init_hooks(checkout=checkout, model_path=str(config.model), served_dir=model_dir, work_dir=tmp,
                         device=config.device, max_lora_rank=config.max_lora_rank,
                         max_batch_tokens=config.max_batch_tokens)
        # Adapters S-LoRA must know at start-up: the zero adapter (base-request fix) and the client adapters.
        zero_dir = self._write_adapter(self._zero_state(8), "zero")
        startup = [zero_dir]
        for name, path in config.client_adapters.items():
            if name == RESERVED_ADAPTER_NAME:
                raise ReservedAdapterError(name)
            startup.append(self._write_adapter(LoraAdapterState.load_pretrained(path, name=name), name))
            self._adapters[name] = startup[-1]
        setting["max_req_total_len"] = int(opts.get("max_req_total_len", 2048))
        setting["nccl_port"] = _free_port()
        max_tokens = int(opts.get("max_total_token_num", 8192))
        self._params = InputParams(
            max_req_total_len=setting["max_req_total_len"], max_total_token_num=max_tokens,
            pool_size_lora=int(opts.get("pool_size_lora", 4096)), batch_max_tokens=config.max_batch_tokens,
            running_max_req_size=config.max_running_requests, swap=True, prefetch=False, prefetch_size=0,
            scheduler="slora", profile=False, batch_num_adapters=None, enable_abort=False, dummy=False,
            no_lora_compute=False, no_lora_swap=False, no_kernel=False, no_mem_pool=False, bmm=False, no_lora=False,
            fair_weights=[1])
        self._loop = asyncio.new_event_loop()
        router = RouterManager(str(model_dir), startup, load_way="HF", world_size=1,
                               eos_id=self._cfg.get("eos_token_id"), router_port=_free_port(),
                               detokenization_port=_free_port(), model_rpc_ports=[_free_port()],
                               input_params=self._params, log_stats=False)
        self._loop.run_until_complete(router.wait_to_model_ready())
        self._collector = _OutputCollector()
        # outputs of submit()ted requests that finished inside a generate() call: the next step() hands them out
        self._kept: list[ClientOutput] = []
        router.send_to_detokenization = self._collector
        self._attach(router, zero_dir)
        self._closed = False

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        """Runs ``shape`` through S-LoRA's normal path. S-LoRA never mixes prefill and decode, so a shape with both
        runs as its decode step followed by its prefill step (with the fine-tuning rows); the record sums their
        measured times: what S-LoRA takes to serve that composition."""
        ch = self.channel
        draw = ProfileDraw(shape, int(self._hf_cfg["vocab_size"]))
        run = f"{_PROFILE_PREFIX}{time.monotonic_ns()}"
        ch.profiling, ch.profile_records = True, []
        try:
            if shape.num_decode:
                for i in range(shape.num_decode):
                    self._add(f"{run}-d{i}", draw.tokens(max(1, shape.decode_context)), None, 2)
                self._step()  # warm-up prefill of the decode rows' contexts (not part of the profiled shape)
                ch.profile_records.clear()
            for i, n in enumerate(shape.prefill_lengths):
                self._add(f"{run}-p{i}", draw.tokens(n), None, 1)
            if shape.finetune_lengths:
                ch.profile_samples = draw.finetune_samples()
            for _ in range(8):
                if not (self.router.running_batch is not None or self.router.req_queue.waiting_req_list
                        or ch.profile_samples):
                    break
                self._step()
            records = list(ch.profile_records)
        finally:
            ch.profiling, ch.profile_samples, ch.profile_records = False, None, []
        if not records:
            raise RuntimeError(f"the profile step for {shape} did not run")
        decode = [r for r in records if r.num_decode][:1]
        prefill = [r for r in records if r.prefill_lengths or r.finetune_lengths][:1]
        parts = decode + prefill
        record = StepRecord(step_id=parts[-1].step_id, start_time=parts[0].start_time,
                            duration_s=sum(r.duration_s for r in parts), mode=ExecutionMode.EAGER,
                            prefill_lengths=sum((r.prefill_lengths for r in prefill), ()),
                            num_decode=sum(r.num_decode for r in decode), kv_tokens=sum(r.kv_tokens for r in decode),
                            finetune_sample_ids=sum((r.finetune_sample_ids for r in prefill), ()),
                            finetune_lengths=sum((r.finetune_lengths for r in prefill), ()), synthetic=True)
        if ch.step_sink is not None:
            ch.step_sink(record)
        return record

    # ------------------------------------------------------------------------------------ HostDriver

    def load_client_adapter(self, name: str, path: str) -> None:
        if name == RESERVED_ADAPTER_NAME:
            raise ReservedAdapterError(name)
        directory = self._write_adapter(LoraAdapterState.load_pretrained(path, name=name), name)
        self._register(directory)
        self._adapters[name] = directory

    def _add(self, rid: str, prompt: list[int], adapter_dir: str | None, max_tokens: int,
             ignore_eos: bool = True) -> None:
        from slora.server.sampling_params import SamplingParams

        params = SamplingParams(do_sample=False, ignore_eos=ignore_eos, max_new_tokens=max_tokens)
        params.stop_sequences = []
        params.verify()
        self.router.add_req(adapter_dir, prompt, params, rid)

    def submit(self, request: ClientRequest) -> None:
        loaded = {n for n in self._adapters if not n.startswith(RESERVED_ADAPTER_NAME + "/")}
        check_client_adapter(request, loaded)
        rid = request.request_id
        if (rid in self._collector.live or rid.startswith(FINETUNE_REQUEST_PREFIX)
                or rid.startswith(_PROFILE_PREFIX)):
            raise ValueError(f"request id {rid!r} is already in flight or reserved")
        now = time.monotonic()
        self._collector.live[rid] = _Live(request, now)
        self._add(rid, list(request.prompt_ids), self._adapters.get(request.adapter) if request.adapter else None,
                  request.max_tokens, request.ignore_eos)
        note_arrival(self.channel, rid, now, request.slo)

    def has_unfinished(self) -> bool:
        # Unfinished until step() returned the output: the collector moves a request to ``finished`` as its last
        # token streams out, before the step's record reaches the core's step sink, which reads this answer.
        return bool(self._collector.live) or bool(self._collector.finished) or bool(self._kept)

    def _step(self) -> None:
        try:
            self._loop.run_until_complete(self.router._step())
        except Exception as exc:
            # S-LoRA changes the router's and the model's batch in separate calls: a step that raised part-way can
            # leave them disagreeing, and then every later step fails. Reset to a consistent engine, then re-raise.
            try:
                recover(self.router, self.server, self.channel)
            except Exception as again:  # noqa: BLE001 - the step's own error is the one to report
                exc.add_note(f"deltaserve_slora: resetting the engine after this failure failed too ({again!r}); "
                             "the host's engine state is undefined: restart it")
                raise exc from None
            waiting = {r.request_id for r in self.router.req_queue.waiting_req_list}
            lost = [rid for rid in self._collector.live if rid not in waiting]
            for rid in lost:
                self._collector.live.pop(rid, None)
                self.channel.info.pop(rid, None)
            exc.add_note(f"deltaserve_slora: this S-LoRA step failed, so the host dropped its running batch and reset "
                         f"its engine state (later steps run on a consistent engine); requests {lost} get no output")
            raise

    def step(self) -> list[ClientOutput]:
        self._step()
        out, self._collector.finished = self._collector.finished, []
        return take_kept(self._kept) + out

    def run_idle_step(self) -> bool:
        if self.has_unfinished() or self.router.running_batch is not None or self.channel.interceptor is None:
            return False
        before = self.channel.forwards
        self._step()
        return self.channel.forwards > before

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return run_to_completion(self, requests, self._kept)

    def shutdown(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._kept.clear()
        uninstall()
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            self._loop.close()
            if not self.config.options.get("work_dir"):
                shutil.rmtree(self._tmp, ignore_errors=True)
