"""The reference host: a small, readable inference engine that implements :class:`HostHooks` natively.

It exists to define the contract by example (the conformance suite's reference, the template an engine
maintainer copies) and to give the co-serving demo a host that installs with DeltaServe itself. It is a real
engine, not a mock: continuous batching over a transformers Llama-family checkpoint (Llama, SmolLM2, Qwen2/3
share the decoder-layer shape it walks), per-request LoRA adapters, prefill and decode that mix in one step or
not (``HostConfig.mixed_batches``), greedy sampling, CPU or CUDA. It is not a product engine: KV lives in
per-request tensors, attention loops over requests, and there are no CUDA graphs, so it only runs EAGER.

Rows of all requests in a step are concatenated ("varlen") so every linear layer runs once per step, as in
vLLM and SGLang; LoRA is applied per row group, as multi-LoRA engines do. Every module's weights and the
rotary/attention helpers come from the transformers model itself, so its numerics are the checkpoint's.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..adapter_state import LoraAdapterState, parse_peft_key
from ..driver import ClientOutput, ClientRequest, HostConfig, check_client_adapter, run_to_completion, take_kept
from ..hooks import RESERVED_ADAPTER_NAME, ActivationSink, ReservedAdapterError, ScheduleInterceptor, StepSink
from ..hostkit import WithdrawnVersions, profile_seed, published_name
from ..registry import HostSpec
from ..types import (
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ModelSpec,
    ProfileShape,
    ProposedBatch,
    ScheduledRequest,
    StepRecord,
)

__all__ = ["ReferenceHost", "SPEC"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Lora:
    scaling: float
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, "self_attn.q_proj") -> (A, B)


@dataclass
class _Seq:
    """One client request inside the engine."""

    request: ClientRequest
    arrival_time: float
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer, [kv_heads, T, head_dim]

    @property
    def context(self) -> int:
        return 0 if self.kv is None else self.kv[0][0].shape[1]

    def view(self, prefill: bool) -> ScheduledRequest:
        r = self.request
        return ScheduledRequest(
            request_id=r.request_id, arrival_time=self.arrival_time,
            prefill_tokens=len(r.prompt_ids) if prefill else 0, context_tokens=self.context,
            output_tokens=len(self.output), first_token_time=self.token_times[0] if self.token_times else None,
            last_token_time=self.token_times[-1] if self.token_times else None, slo=r.slo,
        )


@dataclass
class _Row:
    """A contiguous block of rows in the step's concatenated hidden state."""

    start: int
    length: int
    adapter: str | None
    seq: _Seq | None = None  # None for fine-tuning and synthetic rows
    sample: FineTuneSample | None = None
    past: int = 0
    fake_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # calibration decode rows


class ReferenceHost:
    """Reference implementation of :class:`HostHooks` and :class:`HostDriver`. See the module docstring."""

    name = "reference"

    def __init__(self, config: HostConfig) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config
        self.device = torch.device(config.device)
        self.dtype = _DTYPES[config.dtype]
        self.model = AutoModelForCausalLM.from_pretrained(config.model, dtype=self.dtype).to(self.device).eval()
        self.model.requires_grad_(False)
        cfg = self.model.config
        self._inner = self.model.model
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eos_ids = set(_as_list(getattr(cfg, "eos_token_id", None)))
        mixed = config.mixed_batches
        if mixed is None:  # also settable as a host option, e.g. `deltaserve conformance reference --option mixed_batches=false`
            mixed = str(config.options.get("mixed_batches", "true")).lower() not in ("0", "false", "no")
        self.mixed = mixed
        self._adapters: dict[str, _Lora] = {}
        self._withdrawn: WithdrawnVersions[_Lora] = WithdrawnVersions()
        for name, path in config.client_adapters.items():
            self.load_client_adapter(name, path)
        self._interceptor: ScheduleInterceptor | None = None
        self._activation_sink: ActivationSink | None = None
        self._step_sink: StepSink | None = None
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        # outputs of submit()ted requests that finished inside a generate() call: the next step() hands them out
        self._kept: list[ClientOutput] = []
        self._lock = threading.Lock()
        self._step_ids = itertools.count()
        self._capabilities = HostCapabilities(
            engine="deltaserve-reference", engine_version=_own_version(), mixed_batches=self.mixed,
            graph_modes=frozenset({ExecutionMode.EAGER}), activation_dtype=config.dtype, device=str(self.device),
            supports_abort=True, max_finetune_tokens_per_step=config.max_batch_tokens,
        )

    # ------------------------------------------------------------------------------------ HostHooks

    def capabilities(self) -> HostCapabilities:
        return self._capabilities

    def model_spec(self) -> ModelSpec:
        cfg = self.model.config
        return ModelSpec(path=str(self.config.model), architecture=type(self.model).__name__,
                         num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                         dtype=self.config.dtype)

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        self._interceptor = interceptor

    def capture_activation(self, sink: ActivationSink | None) -> None:
        self._activation_sink = sink

    def report_step_time(self, sink: StepSink | None) -> None:
        self._step_sink = sink

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return ExecutionMode.EAGER  # no CUDA graphs in the reference engine: every step is eager

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)

    def publish_adapter(self, state: LoraAdapterState) -> str:
        # A fresh name per version: requests on an older version keep their KV, new ones never reuse it.
        name = published_name(state.name, state.version)
        self._adapters[name] = self._to_lora(state)
        return name

    def retract_adapter(self, name: str) -> None:
        """Stop serving published version ``name`` (the core prunes old versions): refused from now on, its weights
        kept until the last request submitted on it before has finished."""
        lora = self._adapters.pop(name, None)
        if lora is not None:
            self._withdrawn.hold(name, lora)
            self._forget_withdrawn()

    def _forget_withdrawn(self) -> None:
        with self._lock:
            unfinished = [s.request for s in self._waiting]
        self._withdrawn.release(unfinished + [s.request for s in self._running])

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        gen = torch.Generator().manual_seed(profile_seed(shape))
        vocab = self.model.config.vocab_size
        rows: list[_Row] = []
        pos = 0
        for n in shape.prefill_lengths:
            rows.append(_Row(pos, n, None))
            pos += n
        for _ in range(shape.num_decode):
            kv = [(torch.randn(self.num_kv_heads, shape.decode_context, self.head_dim, dtype=self.dtype,
                               device=self.device, generator=None),) * 2 for _ in range(len(self._layers))]
            rows.append(_Row(pos, 1, None, past=shape.decode_context, fake_kv=kv))  # type: ignore[arg-type]
            pos += 1
        for i, n in enumerate(shape.finetune_lengths):
            ids = tuple(torch.randint(0, vocab, (n,), generator=gen).tolist())
            rows.append(_Row(pos, n, RESERVED_ADAPTER_NAME if RESERVED_ADAPTER_NAME in self._adapters else None,
                             sample=FineTuneSample(-1 - i, ids, (False,) + (True,) * (n - 1))))
            pos += n
        tokens = torch.randint(0, vocab, (pos,), generator=gen)
        for r in rows:
            if r.sample is not None:
                tokens[r.start:r.start + r.length] = torch.tensor(r.sample.input_ids)
        record = self._execute(next(self._step_ids), rows, tokens, synthetic=True)
        return record

    # ------------------------------------------------------------------------------------ HostDriver

    def load_client_adapter(self, name: str, path: str) -> None:
        if name == RESERVED_ADAPTER_NAME:
            raise ReservedAdapterError(name)
        self._adapters[name] = self._to_lora(LoraAdapterState.load_pretrained(path, name=name))

    def submit(self, request: ClientRequest) -> None:
        check_client_adapter(request, self._adapters)
        if len(request.prompt_ids) > self.config.max_batch_tokens:
            raise ValueError(f"request {request.request_id!r}: prompt of {len(request.prompt_ids)} tokens exceeds "
                             f"max_batch_tokens={self.config.max_batch_tokens}; raise it in HostConfig")
        self._enqueue(request)

    def _enqueue(self, request: ClientRequest) -> None:
        """Queue an admitted request and tell the core it arrived (``submit`` after its checks)."""
        now = time.monotonic()
        with self._lock:
            self._waiting.append(_Seq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running or self._kept)

    def step(self) -> list[ClientOutput]:
        outputs = self._step(allow_idle=False)
        return take_kept(self._kept) + outputs

    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            return False
        return bool(self._step(allow_idle=True, report_executed=True))

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return run_to_completion(self, requests, self._kept)

    def shutdown(self) -> None:
        self._waiting.clear()
        self._running.clear()
        self._kept.clear()

    # ------------------------------------------------------------------------------------ scheduling

    @property
    def _layers(self) -> torch.nn.ModuleList:
        return self._inner.layers

    def _schedule(self) -> tuple[list[_Seq], list[_Seq], list[_Seq]]:
        """Pick (prefills, decodes, left waiting). Mixed hosts take both; otherwise prefill steps come first."""
        budget = self.config.max_batch_tokens
        decodes = list(self._running)
        if not self.mixed and self._waiting and len(decodes) < self.config.max_running_requests:
            decodes = []
        budget -= len(decodes)
        prefills: list[_Seq] = []
        with self._lock:
            while (self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests
                   and len(self._waiting[0].request.prompt_ids) <= budget):
                seq = self._waiting.popleft()
                budget -= len(seq.request.prompt_ids)
                prefills.append(seq)
            left = list(self._waiting)
        if not self.mixed and prefills:
            decodes = []
        return prefills, decodes, left

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202 - two return shapes
        prefills, decodes, left = self._schedule()
        deferred = [s for s in self._running if s not in decodes]
        step_id = next(self._step_ids)
        now = time.monotonic()
        batch = ProposedBatch(
            step_id=step_id, now=now,
            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),
            waiting=tuple([s.view(True) for s in left] + [s.view(False) for s in deferred]),
        )
        batch = ProposedBatch(batch.step_id, batch.now, batch.scheduled, batch.waiting, self.graph_mode(batch))
        samples: Sequence[FineTuneSample] = ()
        if self._interceptor is not None and (batch.scheduled or allow_idle or not self.has_unfinished()):
            samples = tuple(self._interceptor.on_schedule(batch))
        if samples and RESERVED_ADAPTER_NAME not in self._adapters:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter() loaded the reserved "
                               "adapter; the core must call set_finetune_adapter first")
        ft_tokens = sum(s.num_tokens for s in samples)
        if ft_tokens > self._capabilities.max_finetune_tokens_per_step:
            raise RuntimeError(f"interceptor injected {ft_tokens} fine-tuning tokens, over this host's "
                               f"max_finetune_tokens_per_step={self._capabilities.max_finetune_tokens_per_step}")
        if samples and decodes and not self.mixed:
            raise RuntimeError("fine-tuning rows were injected into a decode step of a host without mixed batches "
                               "(capabilities().mixed_batches is False); the core must admit only into prefill steps")
        if not prefills and not decodes and not samples:
            return False if report_executed else []
        rows: list[_Row] = []
        ids: list[int] = []
        for s in prefills:
            rows.append(_Row(len(ids), len(s.request.prompt_ids), s.request.adapter, seq=s))
            ids.extend(s.request.prompt_ids)
        for s in decodes:
            rows.append(_Row(len(ids), 1, s.request.adapter, seq=s, past=s.context))
            ids.append(s.output[-1])
        for sample in samples:
            rows.append(_Row(len(ids), sample.num_tokens, RESERVED_ADAPTER_NAME, sample=sample))
            ids.extend(sample.input_ids)
        self._running.extend(prefills)
        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))
        outputs = []
        for s in [s for s in self._running if self._is_done(s)]:
            self._running.remove(s)
            out = ClientOutput(s.request.request_id, tuple(s.output), s.arrival_time, s.token_times[0],
                               s.token_times[-1], tuple(s.token_times))
            outputs.append(out)
        if self._withdrawn:
            self._forget_withdrawn()
        if report_executed:
            return True
        return outputs

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in self.eos_ids

    # ------------------------------------------------------------------------------------ the forward

    def _to_lora(self, state: LoraAdapterState) -> _Lora:
        pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            if tensor.shape[0] > self.config.max_lora_rank:
                raise ValueError(f"adapter {state.name!r} has rank {tensor.shape[0]} > max_lora_rank="
                                 f"{self.config.max_lora_rank}; raise HostConfig.max_lora_rank")
            # Copies: the core may keep training the tensors it handed over; the host serves this snapshot.
            pairs[(layer, module)] = (tensor.detach().to(self.device, self.dtype, copy=True),
                                      b.detach().to(self.device, self.dtype, copy=True))
        return _Lora(state.config.scaling, pairs)

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        for adapter, index in groups.items():
            lora = self._adapters.get(adapter) or self._withdrawn[adapter]
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out

    def _execute(self, step_id: int, rows: list[_Row], tokens: torch.Tensor, synthetic: bool = False) -> StepRecord:
        sink = self._activation_sink
        ft_rows = [r for r in rows if r.sample is not None]
        ft_only = bool(ft_rows) and len(ft_rows) == len(rows)
        capture = sink is not None and bool(ft_rows) and not synthetic
        aborted = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.monotonic()
        with torch.inference_mode():
            if capture:
                sink.begin_step(step_id, [r.sample for r in ft_rows])  # type: ignore[misc]
            tokens = tokens.to(self.device)
            positions = torch.cat([torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)
            groups: dict[str, list[int]] = {}
            for r in rows:
                if r.adapter is not None:
                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))
            index = {a: torch.tensor(v, device=self.device) for a, v in groups.items()}
            hidden = self._inner.embed_tokens(tokens)
            cos, sin = self._inner.rotary_emb(hidden.unsqueeze(0), positions.unsqueeze(0))
            for li, layer in enumerate(self._layers):
                if ft_only and sink is not None and not synthetic and sink.should_abort(step_id):
                    aborted = True
                    break
                if capture:
                    for r in ft_rows:
                        sink.layer_input(step_id, li, r.sample.sample_id,  # type: ignore[union-attr]
                                         hidden[r.start:r.start + r.length])
                elif synthetic and ft_rows:
                    for r in ft_rows:  # the copy a capture sink makes, so calibration prices it
                        hidden[r.start:r.start + r.length].clone()
                hidden = self._layer(li, layer, hidden, rows, cos, sin, index)
            if not aborted:
                self._sample(rows, hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        duration = time.monotonic() - start
        ft_ids = tuple(r.sample.sample_id for r in ft_rows)  # type: ignore[union-attr]
        if capture:
            sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())  # type: ignore[union-attr]
        record = StepRecord(
            step_id=step_id, start_time=start, duration_s=duration, mode=ExecutionMode.EAGER,
            prefill_lengths=tuple(r.length for r in rows if r.sample is None and r.past == 0 and r.fake_kv is None),
            num_decode=sum(1 for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),
            kv_tokens=sum(r.past for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),
            finetune_sample_ids=() if aborted else ft_ids,
            finetune_lengths=() if aborted else tuple(r.length for r in ft_rows),
            aborted_sample_ids=ft_ids if aborted else (), synthetic=synthetic,
        )
        if self._step_sink is not None:
            self._step_sink(record)
        return record

    def _layer(self, li: int, layer: torch.nn.Module, hidden: torch.Tensor, rows: list[_Row],
               cos: torch.Tensor, sin: torch.Tensor, index: dict[str, torch.Tensor]) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        t = x.shape[0]
        q = self._linear(x, attn.q_proj, li, "self_attn.q_proj", index).view(t, self.num_heads, self.head_dim)
        k = self._linear(x, attn.k_proj, li, "self_attn.k_proj", index).view(t, self.num_kv_heads, self.head_dim)
        v = self._linear(x, attn.v_proj, li, "self_attn.v_proj", index).view(t, self.num_kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3 normalises q and k per head before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos, sin)
        q, k, v = q[0], k[0], v.transpose(0, 1)  # [heads, T, head_dim]
        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)
        for r in rows:
            sl = slice(r.start, r.start + r.length)
            kr, vr = k[:, sl], v[:, sl]
            if r.seq is not None or r.fake_kv is not None:
                cache = (r.seq.kv if r.seq is not None else r.fake_kv)
                if cache is not None and r.past > 0:
                    kr = torch.cat([cache[li][0], kr], dim=1)
                    vr = torch.cat([cache[li][1], vr], dim=1)
                if r.seq is not None:
                    if r.seq.kv is None:
                        r.seq.kv = [None] * len(self._layers)  # type: ignore[list-item]
                    r.seq.kv[li] = (kr, vr)
            q_pos = torch.arange(r.past, r.past + r.length, device=x.device)
            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]
            out[:, sl] = F.scaled_dot_product_attention(q[:, sl].unsqueeze(0), kr.unsqueeze(0), vr.unsqueeze(0),
                                                        attn_mask=mask, scale=attn.scaling, enable_gqa=True)[0]
        attn_out = self._linear(out.transpose(0, 1).reshape(t, -1), attn.o_proj, li, "self_attn.o_proj", index)
        hidden = hidden + attn_out
        x = layer.post_attention_layernorm(hidden)
        mlp = layer.mlp
        gate = self._linear(x, mlp.gate_proj, li, "mlp.gate_proj", index)
        up = self._linear(x, mlp.up_proj, li, "mlp.up_proj", index)
        return hidden + self._linear(mlp.act_fn(gate) * up, mlp.down_proj, li, "mlp.down_proj", index)

    def _sample(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        # Synthetic (calibration) inference rows are sampled too, so profiled steps cost what real ones do.
        inference = [r for r in rows if r.sample is None]
        if not inference:
            return
        last = torch.tensor([r.start + r.length - 1 for r in inference], device=hidden.device)
        logits = self.model.lm_head(self._inner.norm(hidden.index_select(0, last)))
        tokens = logits.argmax(dim=-1).tolist()
        now = time.monotonic()
        for r, tok in zip(inference, tokens):
            if r.seq is not None:
                r.seq.output.append(int(tok))
                r.seq.token_times.append(now)


def _as_list(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]  # type: ignore[call-overload]


def _own_version() -> str:
    import deltaserve_core

    return deltaserve_core.__version__


SPEC = HostSpec(
    name="reference",
    description="DeltaServe's reference engine (plain PyTorch over a transformers Llama-family checkpoint)",
    factory="deltaserve_core.testing.reference_host:ReferenceHost",
    install_command="pip install deltaserve",
    notes="ships with deltaserve; the conformance suite's reference and the template for new hosts",
    static_capabilities={"mixed_batches": "configurable (default yes)", "graph_modes": "eager",
                         "abort": "yes", "devices": "cpu, cuda", "dtypes": "float32, bfloat16, float16"},
)
