"""The host protocol: what an inference engine must offer for DeltaServe to co-serve fine-tuning on it.

Two sides meet here.

*The host* (an adapter for vLLM, SGLang, S-LoRA, or the reference engine) implements :class:`HostHooks`.
Its four hooks are installation points, not callbacks: the core calls each once at start-up with a
core-side object, and from then on the *host* calls that object at the moments the hook names.

*The core* implements :class:`ScheduleInterceptor`, :class:`ActivationSink` and :class:`StepSink`.

The split follows what real engines can offer without a fork: vLLM and SGLang run scheduling and the
forward pass in different processes (EngineCore/worker, scheduler/TP worker), so every object handed to
the forward side (the :class:`ActivationSink`) must be picklable or rebuilt in that process by the adapter;
S-LoRA has no mixed batches and no module hooks, so nothing here assumes either.

One capability is optional: a host that can lend its own weights to the backward process implements
:class:`LendsBaseWeights` as well, and the core maps them instead of loading a second copy of the model.

``validate_host`` checks a host against this module before anything starts.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from .adapter_state import LoraAdapterState
from .types import (
    PROTOCOL_VERSION,
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ModelSpec,
    ProfileShape,
    ProposedBatch,
    StepRecord,
)

__all__ = [
    "RESERVED_ADAPTER_NAME",
    "HostHooks",
    "LendsBaseWeights",
    "ScheduleInterceptor",
    "ActivationSink",
    "StepSink",
    "HostProtocolError",
    "ReservedAdapterError",
    "validate_host",
    "HOOK_NAMES",
    "REQUIRED_MEMBERS",
]

#: LoRA adapter name under which fine-tuning rows run. Hosts must refuse client requests naming it.
RESERVED_ADAPTER_NAME = "__deltaserve_finetune__"


class ReservedAdapterError(ValueError):
    """A client addressed the adapter DeltaServe reserves for fine-tuning rows."""

    def __init__(self, name: str = RESERVED_ADAPTER_NAME) -> None:
        super().__init__(
            f"adapter {name!r} is reserved for DeltaServe's fine-tuning rows and cannot serve client requests; "
            "request the published adapter instead (see `deltaserve` job logs for its current name)"
        )


# ---------------------------------------------------------------------------------------------- core side


class ScheduleInterceptor(Protocol):
    """The core's admission entry point, installed with :meth:`HostHooks.intercept_schedule`."""

    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        """Decide which fine-tuning samples join ``batch``.

        Called by: the host's scheduler, in the process that forms batches, exactly once per step, after
        the host has chosen its inference batch and before it dispatches it (also for steps with no
        inference rows, so the core can issue a fine-tuning-only step). Returns the samples to add to
        *this* step as prefill-only rows on :data:`RESERVED_ADAPTER_NAME`; an empty sequence means the step
        runs exactly as the host proposed it. Must return within tens of microseconds: it is on the
        engine's critical path. Never blocks, never raises for policy reasons.
        """
        ...

    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        """Tell the core a client request has entered the host.

        Called by: the host, from whichever thread accepts requests (it may run while a step executes),
        once per client request. The core uses it to abort a running fine-tuning-only step so the new
        request is not delayed by more than one layer. Must not block. A request the host accepts while a step
        executes must never be lost: it joins a later step like any other (a host that rebuilds its waiting queue
        from what it scheduled drops it). Never called for a request ``submit`` refuses (it raised): that request never
        entered the host, and the core would abort fine-tuning steps for it and wait on a request never scheduled.
        """
        ...


class ActivationSink(Protocol):
    """Receives the residual-stream input of every decoder layer for fine-tuning rows.

    Installed with :meth:`HostHooks.capture_activation`; called by the host in the process that runs the
    forward pass (possibly another process than the scheduler: the object is pickled there). Every call names the
    step by the ``step_id`` its batch was offered to ``on_schedule`` with (its record's), never by a count the forward
    side keeps itself: the core matches captures to admissions by it.
    """

    def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
        """A step carrying ``samples`` is about to run its forward. Called once per such step, before layer 0."""
        ...

    def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        """The input of decoder layer ``layer`` for one sample: shape ``[num_tokens, hidden_size]``.

        Called once per (layer, fine-tuning sample) of the step, in layer order, *before* the layer runs.
        The sink copies what it keeps: the host may reuse ``hidden`` after the call returns. Never called
        for inference rows.
        """
        ...

    def should_abort(self, step_id: int) -> bool:
        """Whether the host must stop a fine-tuning-only step now.

        Called by: the host at every decoder-layer boundary of a step that carries *only* fine-tuning rows
        (hosts with ``supports_abort``). On ``True`` the host stops the forward at that boundary, calls
        :meth:`end_step` with all samples aborted and reports them in ``StepRecord.aborted_sample_ids``.
        Fine-tuning rows that share a step with client rows are never aborted: they complete with it.
        """
        ...

    def end_step(self, step_id: int, completed: Sequence[int], aborted: Sequence[int]) -> None:
        """The forward of a step that carried fine-tuning rows finished (or stopped); ids of each outcome."""
        ...


class StepSink(Protocol):
    """Receives one :class:`StepRecord` per executed step (installed with :meth:`HostHooks.report_step_time`)."""

    def __call__(self, record: StepRecord) -> None: ...


# ---------------------------------------------------------------------------------------------- host side


@runtime_checkable
class HostHooks(Protocol):
    """What an inference engine offers DeltaServe. Implemented by one adapter per engine.

    Unless a member says otherwise it is called by the core, in the process that owns the host object
    (the one that created it through the registry), a handful of times during start-up, and never
    concurrently with itself.
    """

    #: Registry name of the host (``"reference"``, ``"vllm"``, ...), used in every error message.
    name: str

    def capabilities(self) -> HostCapabilities:
        """What this host supports. Called at start-up; must be cheap and constant for the host's lifetime."""
        ...

    def model_spec(self) -> ModelSpec:
        """The served base model, for the backward process and the calibration store."""
        ...

    # -- the four hooks -------------------------------------------------------------------------------

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        """Install (or with ``None`` remove) the core's admission callback.

        From then on the host calls ``interceptor.on_schedule(batch)`` once per step before dispatch with
        the batch it will run, adds the returned samples to that same step as prefill-only rows on the
        reserved adapter (no prefix-cache reads, no sampling output), retires them after that one forward,
        and never lets them reach a client. It calls ``interceptor.on_arrival`` for each client request.
        Samples the step cannot take are refused in that step's record (``aborted_sample_ids``), never carried
        to a later step. A later call replaces the installed interceptor, which is never called again.
        """
        ...

    def capture_activation(self, sink: ActivationSink | None) -> None:
        """Install (or remove) the activation sink; the host then feeds it per the :class:`ActivationSink` contract.

        Steps that carry fine-tuning rows must run eagerly so that capture hooks fire. A later call replaces the
        installed sink, which is never called again.
        """
        ...

    def report_step_time(self, sink: StepSink | None) -> None:
        """Install (or remove) the step sink: exactly one :class:`StepRecord` per executed step, in step order,
        with the composition that actually ran and its device-complete duration.
        Called by the host in the scheduling process after the step's outputs are processed, never before (the
        core reads request state when a record arrives). A later call
        replaces the installed sink, which is never called again."""
        ...

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        """The execution mode the host would use for ``batch`` without fine-tuning rows.

        Called by the core inside ``on_schedule`` (so: scheduling process, once per step, hot path). Must be
        a pure function of the batch's shape and the host's configuration, and agree with the ``mode`` of
        the step's :class:`StepRecord` whenever no fine-tuning rows were added.
        """
        ...

    # -- what the hooks need -------------------------------------------------------------------------

    def set_finetune_adapter(self, state: LoraAdapterState) -> None:
        """Load or replace the weights of the reserved fine-tuning adapter.

        Called by the core before the first admission and after every optimizer step, never while a step
        carrying fine-tuning rows is in flight. Fine-tuning rows of later steps must use exactly these
        weights (the training path is only exact if the forward sees the current adapter). The host must copy
        what it keeps: once the call returns, ``state`` is the caller's to change. A host that cannot apply every
        target module of ``state`` must refuse it by raising, never run with part of it. A state it cannot load at
        all (a rank above its ``max_lora_rank``, say) is refused the same way: by raising, never by logging the
        error and keeping the previous weights (the core would train on rows it did not compute). Client requests in
        flight when it is called keep the weights they were submitted on: it changes the reserved adapter only, never
        the adapter (or the adapter slot) of a client request. A state carries its own rank and ``lora_alpha``: later
        rows must run at its ``lora_alpha / r`` also when the state installed before it had another rank or alpha (a
        second job on the running engine), never at the scaling the reserved slot was first loaded with.
        """
        ...

    def publish_adapter(self, state: LoraAdapterState) -> str:
        """Make trained weights servable to clients; returns the client-visible adapter name.

        Clients must be able to request the returned name exactly as returned, whatever the job's adapter name
        holds (capitals, digits, ``_``, ``-``, ``.``): the core hands it to clients verbatim.

        Called by the core per the job's publish policy. A host must never serve KV computed with older
        weights under the returned name (publish under a fresh name/version or reset its prefix cache).
        The returned name serves exactly ``state``'s weights until that name is published again: never those of a
        later :meth:`set_finetune_adapter` (the host keeps its own copy), and a second publish of the same name and
        version (a restarted job redoing a step) replaces them. Requests in flight when it is called keep the
        adapter they were submitted on, never moved to another one. A host that cannot serve every target module of
        ``state`` (an ``lm_head`` its LoRA kernels do not cover, say) must refuse it by raising, never serve the
        returned name without some of them.
        """
        ...

    def retract_adapter(self, name: str) -> None:
        """Withdraw published version ``name`` (a name :meth:`publish_adapter` returned).

        Called by the core when it prunes the versions past the job's ``checkpoint.keep`` (after each publish beyond
        it), so a host that ignores it keeps every version it ever published. It withdraws exactly that version:
        every other name keeps serving its weights, other versions of the same adapter included (a host that keys its
        adapter table by the job's adapter name and unloads by that key withdraws the newest version with the oldest).
        Afterwards a request naming ``name`` is refused by ``submit`` exactly as one naming an adapter the host never
        loaded (:func:`~deltaserve_core.driver.check_client_adapter`), never served on the base model or on another
        version. Requests submitted on it before the call (running or queued) finish on its weights, never failed or
        moved to another adapter: the core prunes right after a publish, while clients of the oldest version may still
        be decoding. Its adapter slot and weights are the host's to free once those requests are done.
        """
        ...

    def run_profile_step(self, shape: ProfileShape) -> StepRecord:
        """Execute one synthetic step of ``shape`` through the host's normal path and return its record.

        Called by calibration before the host accepts client requests. The record is also delivered to the
        step sink with ``synthetic=True``, exactly once like every step's. Synthetic rows never reach a client. Its ``duration_s`` is seconds of
        the step's own forward, as for every step (calibration fits it next to served steps), never more than the
        call took. The shape's fine-tuning rows run also before any :meth:`set_finetune_adapter` (on no adapter,
        or one the host makes up), or the call refuses the shape by raising: never dropped from the step, which
        would price fine-tuning tokens at nothing.
        """
        ...


@runtime_checkable
class LendsBaseWeights(Protocol):
    """Optional host capability: lend the engine's own base weights to the backward process.

    Without it (or when :meth:`base_weights` returns ``None``) the core loads a second copy of the base model from
    ``model_spec().path``; with it, the backward process computes on the engine's weights and the model costs its
    memory once. ``validate_host`` does not require it.
    """

    def base_weights(self) -> Mapping[str, torch.Tensor] | None:
        """The engine's live base weights under Hugging Face parameter names, or ``None`` when it cannot lend them.

        Called by: the core, once per :meth:`CoServer.start <deltaserve_core.coserve.CoServer.start>`, in the
        process that owns the host, before the backward process starts. The contract:

        * names are those of ``transformers.AutoModelForCausalLM.from_pretrained(model_spec().path)
          .named_parameters()``, every one of them; a tied output head (``tie_word_embeddings``) may be left out,
          the core ties it to the embedding as transformers does;
        * each tensor is a *view* of a weight the engine computes with (never a copy: a copy costs what lending
          saves), holds the checkpoint's values, has the activation dtype (``capabilities().activation_dtype``) and
          lives on ``capabilities().device``;
        * read-only for the core: the backward process only reads them. They stay valid, unchanged, until the host
          shuts down (an engine that reloads or updates its weights must not lend them);
        * on CPU the core moves them into shared memory in place (``Tensor.share_memory_``: one copy at start-up,
          after which the engine and the backward process use the same pages); on CUDA the backward process maps
          them through CUDA IPC.

        Returning ``None`` is always allowed (the host should log why: e.g. weights repacked for its kernels,
        quantized, or sharded over several workers).
        """
        ...


#: The four hooks named by the design, in the order the conformance suite checks them.
HOOK_NAMES: tuple[str, ...] = ("intercept_schedule", "capture_activation", "report_step_time", "graph_mode")

#: Every member a host must provide, hooks first.
REQUIRED_MEMBERS: tuple[str, ...] = HOOK_NAMES + (
    "capabilities",
    "model_spec",
    "set_finetune_adapter",
    "publish_adapter",
    "retract_adapter",
    "run_profile_step",
)


class HostProtocolError(TypeError):
    """A host does not satisfy :class:`HostHooks`. Names the host, the member and the rule broken."""

    def __init__(self, host: str, member: str, rule: str) -> None:
        self.host = host
        self.member = member
        self.rule = rule
        super().__init__(f"host {host!r}: {member}: {rule}")


def _host_label(host: object) -> str:
    name = getattr(host, "name", None)
    return name if isinstance(name, str) and name else type(host).__qualname__


def _protocol_params(member: str) -> list[inspect.Parameter]:
    sig = inspect.signature(getattr(HostHooks, member))
    return [p for p in sig.parameters.values() if p.name != "self"]


def _annotation_mismatch(host_ann: Any, proto_ann: Any) -> bool:
    """True when both sides are concrete types and plainly disagree (unions/strings are not second-guessed)."""
    if host_ann is inspect.Parameter.empty or proto_ann is inspect.Parameter.empty:
        return False
    if isinstance(host_ann, type) and isinstance(proto_ann, type):
        return not (issubclass(host_ann, proto_ann) or issubclass(proto_ann, host_ann))
    return False


def _resolved_hints(func: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: only names and arity are checked then
        return {}


def validate_host(host: object) -> HostCapabilities:
    """Check ``host`` against :class:`HostHooks`: every member present, callable, with the protocol's
    parameters (same names, same order, nothing extra required) and compatible annotated types; its
    capabilities well-formed and of this protocol version. Returns the capabilities.

    Raises :class:`HostProtocolError` naming the host, the member and the rule it breaks.
    """
    label = _host_label(host)
    name = getattr(host, "name", None)
    if not isinstance(name, str) or not name:
        raise HostProtocolError(label, "name", "must be a non-empty str attribute (the registry name)")
    proto_hints = {m: _resolved_hints(getattr(HostHooks, m)) for m in REQUIRED_MEMBERS}
    for member in REQUIRED_MEMBERS:
        impl = getattr(host, member, None)
        if impl is None:
            raise HostProtocolError(label, member, "is missing; every HostHooks member must be implemented")
        if not callable(impl):
            raise HostProtocolError(label, member, f"must be a method, found {type(impl).__name__}")
        try:
            sig = inspect.signature(impl)
        except (TypeError, ValueError):
            continue  # builtins/C callables: arity cannot be inspected, calls will tell
        expected = _protocol_params(member)
        params = list(sig.parameters.values())
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            continue  # *args accepts whatever the core passes
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        want = ", ".join(p.name for p in expected) or "no arguments"
        if len(positional) < len(expected):
            raise HostProtocolError(
                label, member, f"takes {len(positional)} argument(s) but the protocol passes {len(expected)} ({want})"
            )
        extra_required = [
            p.name for p in params[len(expected):]
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD,)
        ]
        if extra_required:
            raise HostProtocolError(
                label, member, f"requires extra argument(s) {extra_required} that the core never passes; "
                f"the protocol signature is ({want})"
            )
        for got, exp in zip(positional, expected):
            if got.name != exp.name and got.kind is not inspect.Parameter.POSITIONAL_ONLY:
                raise HostProtocolError(
                    label, member, f"parameter {got.name!r} must be named {exp.name!r} (protocol: ({want}))"
                )
        host_hints = _resolved_hints(impl)
        for got, exp in zip(positional, expected):
            if _annotation_mismatch(host_hints.get(got.name, inspect.Parameter.empty),
                                    proto_hints[member].get(exp.name, inspect.Parameter.empty)):
                raise HostProtocolError(
                    label, member, f"parameter {got.name!r} is annotated {host_hints[got.name]!r}, "
                    f"the protocol passes {proto_hints[member][exp.name]!r}"
                )
        if _annotation_mismatch(host_hints.get("return", inspect.Parameter.empty),
                                proto_hints[member].get("return", inspect.Parameter.empty)):
            raise HostProtocolError(
                label, member, f"returns {host_hints['return']!r}, the protocol requires "
                f"{proto_hints[member]['return']!r}"
            )
    lend = getattr(host, "base_weights", None)
    if lend is not None and not callable(lend):
        raise HostProtocolError(label, "base_weights", f"(optional, LendsBaseWeights) must be a method, found "
                                f"{type(lend).__name__}")
    caps = host.capabilities()  # type: ignore[attr-defined]
    if not isinstance(caps, HostCapabilities):
        raise HostProtocolError(label, "capabilities", f"must return HostCapabilities, returned {type(caps).__name__}")
    if caps.protocol_version != PROTOCOL_VERSION:
        raise HostProtocolError(
            label, "capabilities", f"declares protocol_version {caps.protocol_version}, this DeltaServe speaks "
            f"{PROTOCOL_VERSION}; upgrade the adapter or DeltaServe so they match"
        )
    if not all(isinstance(m, ExecutionMode) for m in caps.graph_modes):
        raise HostProtocolError(label, "capabilities", "graph_modes must contain ExecutionMode members only")
    return caps
