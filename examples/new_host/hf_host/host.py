"""DeltaServe on plain Hugging Face transformers + PEFT, written from ``examples/new_host/README.md``.

The engine is small and honest about it: a continuous-batching scheduler (every running request decodes each
step, waiting prompts join while ``max_batch_tokens`` and ``max_running_requests`` allow) over an unmodified
``AutoModelForCausalLM``. Each client request keeps its own transformers KV cache (``past_key_values``) and runs its
own forward; LoRA is PEFT's, one PEFT adapter per client adapter, published version and fine-tuning adapter, made
active per forward. A step's fine-tuning rows run as one right-padded forward without a cache (so they read no
prefix), and decoder-layer pre-hooks feed the activation sink and poll ``should_abort``.

Everything that is not translation to transformers comes from :mod:`deltaserve_core.hostkit` (hook slots, the step
plan and its record, token times, profile inputs, published names) and :mod:`deltaserve_core.driver` (the client
side). Policy (admission, pricing, training) stays in ``deltaserve_core``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import (
    ClientOutput,
    ClientRequest,
    HostConfig,
    InFlightRequests,
    check_client_adapter,
    run_to_completion,
    take_kept,
)
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ActivationSink, ReservedAdapterError
from deltaserve_core.hostkit import (
    HookSlots,
    InstallsHooks,
    ProfileDraw,
    StepPlan,
    TokenClock,
    WithdrawnVersions,
    published_name,
)
from deltaserve_core.types import (
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ModelSpec,
    ProfileShape,
    ProposedBatch,
    ScheduledRequest,
    StepRecord,
)

__all__ = ["HfHost", "create_host"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Abort(Exception):
    """Raised from a decoder layer's pre-hook: the only way to stop a transformers forward at a layer boundary."""


@dataclass
class _Seq:
    """One client request inside the engine: its prompt, what it generated, and its transformers KV cache."""

    request: ClientRequest
    arrival_time: float
    output: list[int] = field(default_factory=list)
    cache: Any = None  # transformers Cache (past_key_values) once prefilled

    @property
    def context(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def view(self, clock: TokenClock, prefill: bool) -> ScheduledRequest:
        first, last = clock.times(self.request.request_id)
        return ScheduledRequest(
            request_id=self.request.request_id, arrival_time=self.arrival_time,
            prefill_tokens=len(self.request.prompt_ids) if prefill else 0, context_tokens=self.context,
            output_tokens=len(self.output), first_token_time=first, last_token_time=last, slo=self.request.slo)


class HfHost(InstallsHooks):
    """:class:`~deltaserve_core.hooks.HostHooks` and :class:`~deltaserve_core.driver.HostDriver` over transformers."""

    name = "hf"

    def __init__(self, config: HostConfig) -> None:
        import transformers

        self.config = config
        self.device = torch.device(config.device)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(config.model, dtype=_DTYPES[config.dtype])
        self.model.to(self.device).eval().requires_grad_(False)
        self.peft: Any = None  # the PeftModel wrapping ``self.model``, made when the first adapter is loaded
        self._slots: dict[str, str] = {}  # engine adapter name -> PEFT adapter name
        self._withdrawn: WithdrawnVersions[str] = WithdrawnVersions()  # PEFT adapter names of retracted versions
        self._slot_ids = itertools.count()
        #: per PEFT adapter: its config and its parameters under LoraAdapterState keys (a new version of the same
        #: shape is copied into them: PEFT's add_adapter walks and rewraps the whole model)
        self._slot_params: dict[str, tuple[Any, dict[str, torch.nn.Parameter]]] = {}
        #: what the PEFT layers are set to (None: unknown, e.g. after an add or delete): set_adapter and
        #: enable/disable_adapter_layers walk every module, so they run only on a change
        self._active: tuple[bool, str | None] | None = None
        self.hooks = HookSlots()
        self.clock = TokenClock()
        self.inflight = InFlightRequests()
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        # Outputs of the step in progress, finished but not yet returned by step(): still unfinished for the core.
        self._returning: list[ClientOutput] = []
        # outputs of submit()ted requests that finished inside a generate() call: the next step() hands them out
        self._kept: list[ClientOutput] = []
        self._lock = threading.Lock()  # submit may run on another thread than step
        self._step_ids = itertools.count()
        eos = getattr(self.model.config, "eos_token_id", None)
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        self._capabilities = HostCapabilities(
            engine="transformers", engine_version=transformers.__version__, mixed_batches=True,
            graph_modes=frozenset({ExecutionMode.EAGER}), activation_dtype=config.dtype, device=str(self.device),
            supports_abort=True, max_finetune_tokens_per_step=config.max_batch_tokens)
        for name, path in config.client_adapters.items():
            self.load_client_adapter(name, path)

    # ------------------------------------------------------------------------------------ HostHooks

    def capabilities(self) -> HostCapabilities:
        return self._capabilities

    def model_spec(self) -> ModelSpec:
        cfg = self.model.config
        return ModelSpec(path=str(self.config.model), architecture=type(self.model).__name__,
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                         dtype=self.config.dtype)

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return ExecutionMode.EAGER  # plain transformers: no graphs, every step eager

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        self._load(RESERVED_ADAPTER_NAME, state)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        name = published_name(state.name, state.version)  # a fresh name per version: no KV is shared across them
        self._load(name, state)
        return name

    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions): refused from now on, its PEFT
        adapter deleted once the last request submitted on it before has finished."""
        slot = self._slots.pop(name, None)
        if slot is not None:
            self._withdrawn.hold(name, slot)
            self._drop_withdrawn()

    def _drop_withdrawn(self) -> None:
        with self._lock:
            unfinished = [s.request for s in self._waiting]
        for slot in self._withdrawn.release(unfinished + [s.request for s in self._running]):
            if self._slots:  # PEFT keeps at least one adapter loaded
                self._drop(slot)

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        draw = ProfileDraw(shape, self.model.config.vocab_size)
        prefills = [_Seq(ClientRequest(f"profile-p{i}", tuple(draw.tokens(n)), 1), 0.0)
                    for i, n in enumerate(shape.prefill_lengths)]
        decodes = [_Seq(ClientRequest(f"profile-d{i}", tuple(draw.tokens(shape.decode_context)), 2), 0.0)
                   for i in range(shape.num_decode)]
        with torch.inference_mode():  # their context, built before the clock starts: only the decode is profiled
            for seq in decodes:
                self._client_forward(seq)
        if shape.finetune_lengths and RESERVED_ADAPTER_NAME not in self._slots:
            # Fine-tuning rows run on the reserved adapter: without it the shape is refused, never run short of them
            # (a record without its rows would price fine-tuning tokens at nothing).
            raise ValueError("run_profile_step: this shape has fine-tuning rows, which run on the reserved adapter; "
                             "call set_finetune_adapter() first (deltaserve_core.calibration.install_calibration_adapter)")
        samples = draw.finetune_samples()
        plan = StepPlan(next(self._step_ids), samples={str(s.sample_id): s for s in samples}, synthetic=True)
        # synthetic rows live only in this call: none reaches a client
        return self._deliver(self._execute(plan, prefills, decodes))

    # ------------------------------------------------------------------------------------ HostDriver

    def load_client_adapter(self, name: str, path: str) -> None:
        if name == RESERVED_ADAPTER_NAME:
            raise ReservedAdapterError(name)
        self._load(name, LoraAdapterState.load_pretrained(path, name=name))

    def submit(self, request: ClientRequest) -> None:
        check_client_adapter(request, self._slots)
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError(f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens exceeds "
                             f"max_batch_tokens={self.config.max_batch_tokens}; raise it in HostConfig")
        now = time.monotonic()
        with self._lock:
            self.inflight.add(request, now)
            self._waiting.append(_Seq(request, now))
        if self.hooks.interceptor is not None:
            self.hooks.interceptor.on_arrival(request.request_id, now)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._returning or self._kept)

    def step(self) -> list[ClientOutput]:
        try:
            done = self._step(idle=False)[1]
        finally:
            self._returning = []
        return take_kept(self._kept) + done

    def run_idle_step(self) -> bool:
        return False if self.has_unfinished() else self._step(idle=True)[0]

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return run_to_completion(self, requests, self._kept)

    def shutdown(self) -> None:
        with self._lock:
            self._waiting.clear()
        self._running.clear()
        self._kept.clear()

    # ------------------------------------------------------------------------------------ scheduling

    def _step(self, idle: bool) -> tuple[bool, list[ClientOutput]]:
        """One engine step: schedule, offer it to the interceptor, run it. Returns (whether it ran, finished)."""
        budget = self.config.max_batch_tokens - len(self._running)
        prefills: list[_Seq] = []
        with self._lock:
            while (self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests
                   and len(self._waiting[0].request.prompt_ids) <= budget):
                prefills.append(self._waiting.popleft())
                budget -= len(prefills[-1].request.prompt_ids)
            left = tuple(self._waiting)
        decodes = list(self._running)
        plan = StepPlan(next(self._step_ids))
        batch = ProposedBatch(plan.step_id, time.monotonic(),
                              scheduled=tuple([s.view(self.clock, True) for s in prefills]
                                              + [s.view(self.clock, False) for s in decodes]),
                              waiting=tuple(s.view(self.clock, True) for s in left))
        samples: Sequence[FineTuneSample] = ()
        if self.hooks.interceptor is not None and (batch.scheduled or idle):
            samples = tuple(self.hooks.interceptor.on_schedule(batch))
        if samples and RESERVED_ADAPTER_NAME not in self._slots:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter() loaded the reserved "
                               "adapter; the core must call set_finetune_adapter first")
        refused: list[int] = []
        for s in samples:  # what the client rows left of the token budget; the rest is refused in this step
            if s.num_tokens <= budget:
                plan.samples[str(s.sample_id)] = s
                budget -= s.num_tokens
            else:
                refused.append(s.sample_id)
        plan.refused = tuple(refused)
        if not prefills and not decodes and not samples:
            return False, []
        self._running.extend(prefills)
        record = self._execute(plan, prefills, decodes)
        now = time.monotonic()
        finished: list[ClientOutput] = []
        for seq in list(self._running):
            rid = seq.request.request_id
            self.clock.observe(rid, len(seq.output), now)
            out = self.inflight.update(rid, seq.output, now, self._is_done(seq))
            if out is not None:
                self._running.remove(seq)
                self.clock.forget(rid)
                finished.append(out)
        self._returning = finished  # the record below reaches the core before step() returns these
        if self._withdrawn:
            self._drop_withdrawn()
        self._deliver(record)
        return True, finished

    def _is_done(self, seq: _Seq) -> bool:
        if len(seq.output) >= seq.request.max_tokens:
            return True
        return bool(seq.output) and not seq.request.ignore_eos and seq.output[-1] in self.eos_ids

    # ------------------------------------------------------------------------------------ the forward

    def _execute(self, plan: StepPlan, prefills: list[_Seq], decodes: list[_Seq]) -> StepRecord:
        """Run one planned step (fine-tuning rows first, then each client row); returns its record, not yet delivered."""
        plan.prefill_lengths = tuple(len(s.request.prompt_ids) for s in prefills)
        plan.num_decode = len(decodes)
        plan.kv_tokens = sum(s.context for s in decodes)
        samples = list(plan.samples.values())
        sink = None if plan.synthetic else self.hooks.activation_sink
        self._sync()
        plan.start = time.monotonic()
        aborted = False
        with torch.inference_mode():
            if samples:
                if sink is not None:
                    sink.begin_step(plan.step_id, samples)
                aborted = self._finetune_forward(plan.step_id, samples, sink, may_abort=not (prefills or decodes))
                if sink is not None:
                    ids = plan.sample_ids
                    sink.end_step(plan.step_id, () if aborted else ids, ids if aborted else ())
            for seq in sorted(prefills + decodes, key=lambda q: q.request.adapter or ""):  # few adapter switches
                self._client_forward(seq)
        self._sync()
        plan.duration = time.monotonic() - plan.start
        return plan.to_record(aborted=aborted)

    def _deliver(self, record: StepRecord) -> StepRecord:
        # After the step's outputs are processed: the core reads request state when a record arrives.
        if self.hooks.step_sink is not None:
            self.hooks.step_sink(record)
        return record

    def _finetune_forward(self, step_id: int, samples: list[FineTuneSample], sink: ActivationSink | None,
                          may_abort: bool) -> bool:
        """One right-padded forward of ``samples`` on the reserved adapter, no KV cache; True when aborted."""
        width = max(s.num_tokens for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        mask = torch.zeros(len(samples), width, dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, :s.num_tokens] = torch.tensor(s.input_ids)
            mask[i, :s.num_tokens] = 1

        def layer_hook(layer: int):  # noqa: ANN202 - a torch forward pre-hook
            def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
                if sink is None:
                    return
                if may_abort and sink.should_abort(step_id):
                    raise _Abort
                hidden = args[0] if args else kwargs["hidden_states"]
                for i, s in enumerate(samples):
                    sink.layer_input(step_id, layer, s.sample_id, hidden[i, :s.num_tokens])
            return hook

        handles = [layer.register_forward_pre_hook(layer_hook(li), with_kwargs=True)
                   for li, layer in enumerate(self.model.model.layers)]
        try:
            self._forward(ids, RESERVED_ADAPTER_NAME, attention_mask=mask.to(self.device), use_cache=False)
        except _Abort:
            return True
        finally:
            for h in handles:
                h.remove()
        return False

    def _client_forward(self, seq: _Seq) -> None:
        """Prefill or decode one client row on its own KV cache; append its greedy token."""
        ids = list(seq.request.prompt_ids) if seq.cache is None else [seq.output[-1]]
        out = self._forward(torch.tensor([ids]), seq.request.adapter, past_key_values=seq.cache, use_cache=True)
        seq.cache = out.past_key_values
        seq.output.append(int(out.logits[0, -1].argmax()))

    def _forward(self, ids: torch.Tensor, adapter: str | None, **kwargs: Any) -> Any:
        """The model's forward on ``adapter`` (None: the base model), last position's logits only."""
        ids = ids.to(self.device)
        if self.peft is None:
            return self.model(input_ids=ids, logits_to_keep=1, **kwargs)
        want = (adapter is not None, None if adapter is None else self._slots.get(adapter) or self._withdrawn[adapter])
        if self._active is None or want[0] != self._active[0]:
            (self.peft.base_model.enable_adapter_layers if want[0] else self.peft.base_model.disable_adapter_layers)()
        if want[1] is not None and (self._active is None or want[1] != self._active[1]):
            self.peft.base_model.set_adapter(want[1], inference_mode=True)
        self._active = want if self._active is None or want[1] is not None else (want[0], self._active[1])
        return self.peft(input_ids=ids, logits_to_keep=1, **kwargs)

    def _load(self, name: str, state: LoraAdapterState) -> None:
        """Load ``state`` whole into a fresh PEFT adapter and serve ``name`` from it (the old one goes after).

        PEFT copies the tensors in, so the caller's state stays the caller's; a state that does not load whole
        (a module PEFT cannot find, a rank over the host's limit) is refused and the old adapter kept."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        cfg = state.config
        if cfg.r > self.config.max_lora_rank:
            raise ValueError(f"adapter {name!r}: rank {cfg.r} exceeds max_lora_rank={self.config.max_lora_rank}")
        old = self._slots.get(name)
        if old is not None and self._slot_params[old][0] == cfg and set(self._slot_params[old][1]) == set(state.tensors):
            with torch.no_grad():  # same shape as the version it replaces: copy into it, every tensor present
                for key, param in self._slot_params[old][1].items():
                    param.copy_(state.tensors[key])
            return
        slot = f"slot{next(self._slot_ids)}"  # PEFT module names may not hold the '.' or '@' of engine names
        self._active = None
        peft_cfg = LoraConfig(r=cfg.r, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.target_modules),
                              lora_dropout=0.0, task_type="CAUSAL_LM")
        if self.peft is None:
            self.peft = get_peft_model(self.model, peft_cfg, adapter_name=slot).eval()
        else:
            self.peft.add_adapter(slot, peft_cfg)
        result = set_peft_model_state_dict(self.peft, dict(state.tensors), adapter_name=slot)
        unloaded = [k for k in result.missing_keys if f".{slot}." in k] + list(result.unexpected_keys)
        if unloaded:
            if self._slots:
                self._drop(slot)
            raise ValueError(f"adapter {name!r} does not load whole into {type(self.model).__name__}: "
                             f"{unloaded[:3]}")
        params = dict(self.peft.named_parameters())
        self._slot_params[slot] = (cfg, {k: params[k.replace(".lora_A.weight", f".lora_A.{slot}.weight")
                                                       .replace(".lora_B.weight", f".lora_B.{slot}.weight")]
                                         for k in state.tensors})
        self._slots[name] = slot
        if old is not None:
            self._drop(old)
        self.peft.eval()

    def _drop(self, slot: str) -> None:
        import warnings

        with warnings.catch_warnings():  # PEFT warns when the active adapter goes; _forward activates per call
            warnings.filterwarnings("ignore", message=r"Adapter .* was active which is now deleted")
            self.peft.delete_adapter(slot)
        self._slot_params.pop(slot, None)
        self._active = None

    def _sync(self) -> None:
        if self.device.type == "cuda":  # durations are device-complete
            torch.cuda.synchronize(self.device)


def create_host(config: HostConfig) -> HfHost:
    """The factory ``deltaserve conformance hf_host.host:create_host`` and the registry call."""
    return HfHost(config)
