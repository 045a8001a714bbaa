"""Plain data that crosses the boundary between a host engine and the DeltaServe core.

Everything here is immutable, picklable and free of engine types, so a host can build it in whichever
process it schedules or executes in (vLLM's EngineCore, SGLang's scheduler process, S-LoRA's router) and
hand it to the core without importing anything engine-specific.

Time is always ``time.monotonic()`` seconds of the process that schedules; durations are seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "PROTOCOL_VERSION",
    "ExecutionMode",
    "RequestSLO",
    "ScheduledRequest",
    "ProposedBatch",
    "FineTuneSample",
    "StepRecord",
    "HostCapabilities",
    "ModelSpec",
    "ProfileShape",
]

#: Version of the host protocol defined in :mod:`deltaserve_core.hooks`. A host states the version it was
#: written against in :attr:`HostCapabilities.protocol_version`; the core refuses a different major version.
PROTOCOL_VERSION: int = 1


class ExecutionMode(str, enum.Enum):
    """How the host runs one forward step.

    ``GRAPH`` is a replay of a captured CUDA graph (or any other pre-recorded execution in which Python
    hooks do not fire); ``EAGER`` dispatches kernels one by one and runs module hooks. The latency model
    keeps one coefficient set per mode, because the same batch differs by up to ~10x between them.
    """

    GRAPH = "graph"
    EAGER = "eager"


@dataclass(frozen=True, slots=True)
class RequestSLO:
    """Latency objectives of one inference request (seconds). ``None`` means "use the job default"."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    avg_tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "avg_tpot_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(
                    f"RequestSLO.{name} must be a positive number of seconds, got {value!r}; "
                    "leave it as None to use the job's default SLO"
                )


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One inference request as the host's scheduler sees it when it proposes a step.

    ``prefill_tokens`` is the number of prompt tokens this step computes for the request (a chunk when
    the host does chunked prefill); 0 means the request decodes one token in this step.
    ``context_tokens`` is the KV-cache length the request attends over *before* this step: for a prefill, the
    prompt tokens already in the cache (earlier chunks, prefix-cache hits), never the tokens this step computes.
    ``first_token_time`` is set once the request has produced its first token; ``last_token_time`` is the
    time of its most recent token (for the TPOT budget); ``output_tokens`` counts tokens generated so far.
    A request with no token yet has no most recent token: ``last_token_time`` is never set while
    ``first_token_time`` is ``None``.
    ``first_token_time`` never changes once set and is never later than ``last_token_time`` (the core measures TTFT
    from one and TPOT from the other). A token's time is never before the forward of the step that produced it
    began (that step's ``StepRecord.start_time``). ``output_tokens`` never counts the prompt (the average-TPOT budget divides by
    it). ``slo`` must be the client request's own ``ClientRequest.slo``, exactly as submitted (``None`` only when the
    client gave none): the core budgets each request against it.
    """

    request_id: str
    arrival_time: float
    prefill_tokens: int = 0
    context_tokens: int = 0
    output_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    slo: RequestSLO | None = None

    @property
    def is_decode(self) -> bool:
        return self.prefill_tokens == 0


@dataclass(frozen=True, slots=True)
class ProposedBatch:
    """The step a host is about to dispatch, offered to :meth:`HostHooks.intercept_schedule` callbacks.

    ``scheduled`` are the requests that run in this step. ``waiting`` are requests that arrived but are
    not in this step (queued prefills, or on hosts without mixed batches the decodes this prefill step
    defers); they matter because their TTFT/TPOT clocks keep running while this step executes. Every request that
    arrived and has not finished must be in ``scheduled`` or ``waiting`` (the core prices admission against all of them).
    A request whose ``submit`` returned before the host proposed the step has arrived: it must be in that step's batch
    (a host whose scheduler takes requests from a queue drains the queue before proposing, never after).
    A request is in at most one of the two, never in both: a decode running in this step is ``scheduled`` only.
    ``mode`` is the execution mode the host would use for the batch *as proposed* (no fine-tuning rows).
    """

    step_id: int
    now: float
    scheduled: tuple[ScheduledRequest, ...]
    waiting: tuple[ScheduledRequest, ...] = ()
    mode: ExecutionMode = ExecutionMode.EAGER

    @property
    def prefill_lengths(self) -> tuple[int, ...]:
        return tuple(r.prefill_tokens for r in self.scheduled if r.prefill_tokens > 0)

    @property
    def num_decode(self) -> int:
        return sum(1 for r in self.scheduled if r.prefill_tokens == 0)

    @property
    def kv_tokens(self) -> int:
        """Total KV-cache tokens read by the step's decode requests (the K of Equations I/II)."""
        return sum(r.context_tokens for r in self.scheduled if r.prefill_tokens == 0)

    @property
    def has_prefill(self) -> bool:
        return any(r.prefill_tokens > 0 for r in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def deferred_decodes(self) -> tuple[ScheduledRequest, ...]:
        """Decoding requests that wait while this step runs (hosts that do not mix prefill and decode)."""
        return tuple(r for r in self.waiting if r.first_token_time is not None)


@dataclass(frozen=True, slots=True)
class FineTuneSample:
    """One tokenised fine-tuning sample.

    ``loss_mask[i]`` says whether the token at position ``i`` is a *target* (a response token); the loss
    at position ``i`` predicts ``input_ids[i]`` from positions ``< i``, the usual causal-LM shift.
    ``sample_id`` is unique within a job and stable across restarts (it indexes the dataset).
    """

    sample_id: int
    input_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]
    epoch: int = 0

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"FineTuneSample {self.sample_id}: input_ids has {len(self.input_ids)} tokens but loss_mask "
                f"has {len(self.loss_mask)}; they must be the same length"
            )
        if len(self.input_ids) < 2:
            # A 1-token row looks like a decode to graph-capturing hosts (vLLM treats an all-1-token batch
            # as uniform decode and may replay a CUDA graph, where capture hooks never fire).
            raise ValueError(
                f"FineTuneSample {self.sample_id} has {len(self.input_ids)} token(s); samples need at least 2 "
                "(one context token and one target)"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_targets(self) -> int:
        return sum(self.loss_mask[1:])


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What a host executed in one step, reported through :meth:`HostHooks.report_step_time`.

    ``duration_s`` is the device-complete wall time of the forward step (for asynchronous hosts: measured
    after the device finished, not when the launch returned); it starts with the forward, never before the step's
    batch was decided (scheduling and ``on_schedule`` are not model time). ``finetune_sample_ids`` lists fine-tuning
    rows that completed the whole forward; ``aborted_sample_ids`` those stopped by an abort (their
    captures are void and they go back to the pool). ``synthetic`` marks calibration steps. A ``step_id`` is never
    reused: calibration and served steps draw from one increasing sequence for the host's lifetime.
    """

    step_id: int
    start_time: float
    duration_s: float
    mode: ExecutionMode
    prefill_lengths: tuple[int, ...] = ()
    num_decode: int = 0
    kv_tokens: int = 0
    finetune_sample_ids: tuple[int, ...] = ()
    finetune_lengths: tuple[int, ...] = ()
    aborted_sample_ids: tuple[int, ...] = ()
    synthetic: bool = False

    @property
    def finetune_tokens(self) -> int:
        return sum(self.finetune_lengths)

    @property
    def has_prefill(self) -> bool:
        return bool(self.prefill_lengths) or bool(self.finetune_lengths)


@dataclass(frozen=True, slots=True)
class HostCapabilities:
    """What a host can do; the core adapts its policy to it instead of asking hosts to fake features.

    - ``mixed_batches``: one step may hold prefill and decode rows (vLLM, SGLang's mixed chunk, the reference
      host); S-LoRA never mixes them, so the core admits fine-tuning only into prefill steps there. A host that
      declares it must run fine-tuning rows injected into a decode-only step in that step.
    - ``graph_modes``: execution modes the host can run steps in. ``{EAGER}`` for hosts without CUDA graphs.
    - ``activation_dtype``: dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``) of captured layer inputs. It
      must be the dtype the engine runs in, never the field's default left as is: the core sizes its activation
      buffer and the backward pass from it.
    - ``supports_abort``: the host checks :meth:`ActivationSink.should_abort` at layer boundaries of
      fine-tuning-only steps.
    - ``max_finetune_tokens_per_step``: largest number of fine-tuning tokens one step may carry (the host's
      token budget minus nothing else); the core never injects more. It must be the host's whole per-step token
      budget (``HostConfig.max_batch_tokens`` for a host started from one): the core subtracts each step's client
      rows itself.
    - ``timing_variant``: any engine setting beyond version, model, device and dtype that changes how long a step
      takes (vLLM: ``"async"`` under async scheduling); calibration profiles are stored per variant, so a profile
      measured under one setting is never reused under another. Empty for hosts with one way of running.
    """

    engine: str
    engine_version: str
    protocol_version: int = PROTOCOL_VERSION
    mixed_batches: bool = True
    graph_modes: frozenset[ExecutionMode] = frozenset({ExecutionMode.EAGER})
    activation_dtype: str = "float32"
    device: str = "cpu"
    supports_abort: bool = True
    max_finetune_tokens_per_step: int = 4096
    timing_variant: str = ""

    def __post_init__(self) -> None:
        if not self.graph_modes:
            raise ValueError("HostCapabilities.graph_modes must name at least one ExecutionMode")
        if self.max_finetune_tokens_per_step <= 0:
            raise ValueError("HostCapabilities.max_finetune_tokens_per_step must be positive")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The served base model as the backward process needs to know it.

    ``path`` must be a local transformers checkpoint folder holding its ``config.json`` (the backward process loads
    or maps the base weights from it when the host cannot share its own tensors), and ``num_layers``,
    ``hidden_size`` and ``vocab_size`` must be that config's own values, never an engine's padded sizes. ``layer_module`` must be the dotted attribute path of the
    decoder-layer list in the transformers model of that folder (``"model.layers"`` for Llama-style families), never
    an engine's own module path. ``dtype`` must be the
    dtype the engine serves the model in (the backward process loads the base and replays captures in it).
    """

    path: str
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str = "float32"
    layer_module: str = "model.layers"


@dataclass(frozen=True, slots=True)
class ProfileShape:
    """A synthetic step for calibration: prefill lengths, a decode batch with its KV length, FT tokens.

    The host builds throw-away requests of these shapes, runs them through its normal scheduling and
    forward path in ``mode`` when it can (falling back to the mode it would naturally choose), and reports
    the resulting :class:`StepRecord` with ``synthetic=True``. The record's ``mode`` is the mode the step ran in (one
    of ``graph_modes``), never the one asked for when the host could not run it.
    """

    prefill_lengths: tuple[int, ...] = ()
    num_decode: int = 0
    decode_context: int = 0
    finetune_lengths: tuple[int, ...] = ()
    mode: ExecutionMode = ExecutionMode.EAGER
    repeats: int = 1
    tags: Sequence[str] = field(default=(), compare=False)
