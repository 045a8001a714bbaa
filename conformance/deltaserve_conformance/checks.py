"""The host contract as plain functions, one rule each, named ``<hook>__<rule>``.

Each check takes a :class:`ConformanceEnv`, drives the host through its hooks and its client API, and raises
``AssertionError`` with a message that names the host, the hook, what was expected and what happened. Checks
are plain functions (so a fork can call one from a debugger or its own tests) and are collected by
``test_conformance.py`` for pytest. ``CHECKS`` lists them with the capability each needs, if any.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

import torch

from deltaserve_core.driver import ClientRequest
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, HostProtocolError, ReservedAdapterError, validate_host
from deltaserve_core.types import ExecutionMode, HostCapabilities, ProfileShape, ProposedBatch

from deltaserve_core.adapter_state import LoraAdapterState

from .harness import PREFIX_SPAN, ConformanceEnv, Recorder, batch_shape, digest, handed_copy, make_prompts, make_samples

__all__ = ["Check", "CHECKS", "run_check"]


@dataclass(frozen=True)
class Check:
    name: str
    hook: str
    func: Callable[[ConformanceEnv], None]
    requires: Callable[[HostCapabilities], str | None] = lambda caps: None  # returns a skip reason or None
    #: a generated or stateful check that asserts every invariant at once (so it also fails hosts that a
    #: narrow check targets); the meta-tests run broad checks only against the broken hosts aimed at them
    broad: bool = False
    #: starts a second host in a child process (tens of seconds); the meta-tests run it only against the broken
    #: hosts aimed at it and the reference, not against every other broken host
    spawns: bool = False

    def __call__(self, env: ConformanceEnv) -> None:
        self.func(env)


CHECKS: list[Check] = []


def check(hook: str, requires: Callable[[HostCapabilities], str | None] | None = None,  # noqa: ANN201
          broad: bool = False, spawns: bool = False):
    def register(func: Callable[[ConformanceEnv], None]) -> Callable[[ConformanceEnv], None]:
        name = func.__name__.removeprefix("check_")
        CHECKS.append(Check(name, hook, func, requires or (lambda caps: None), broad, spawns))
        return func

    return register


class RuleViolation(AssertionError):
    """A check's failure; ``hook`` names the protocol member whose rule was broken (to quote that rule)."""

    def __init__(self, hook: str | None, message: str) -> None:
        super().__init__(message)
        self.hook = hook


#: hook named in a failure -> where its rules are written (``Class.member`` prefixes in rules.RULES)
_RULE_HOMES = {"intercept_schedule": ("HostHooks.intercept_schedule", "ScheduleInterceptor", "#:RESERVED"),
               "capture_activation": ("HostHooks.capture_activation", "ActivationSink"),
               "base_weights": ("LendsBaseWeights",), "protocol": ("#:REQUIRED",),
               "driver": ("HostDriver", "check_client_adapter", "ClientRequest", "ClientOutput"), "model_spec": ("HostHooks.model_spec", "ModelSpec"),
               "capabilities": ("HostHooks.capabilities", "HostCapabilities")}


def _fail(env: ConformanceEnv, hook: str, message: str) -> AssertionError:
    return RuleViolation(hook, f"host {env.host_name!r}, {hook}: {message}")


def _composition(batch: ProposedBatch) -> tuple[tuple[int, ...], int, int]:
    return tuple(sorted(batch.prefill_lengths)), batch.num_decode, batch.kv_tokens


def _inject_into_first_prefill(samples):  # noqa: ANN001, ANN202
    done = []

    def inject(batch: ProposedBatch):  # noqa: ANN202
        if not done and batch.has_prefill:
            done.append(batch.step_id)
            return samples
        return ()

    return inject


def _inject_into_first_idle(samples, fired: list[int]):  # noqa: ANN001, ANN202
    """An inject script: ``samples`` into the first step without client rows (a fine-tuning-only step); its step id
    is appended to ``fired``."""

    def inject(batch: ProposedBatch):  # noqa: ANN202
        if batch.is_empty and not fired:
            fired.append(batch.step_id)
            return samples
        return ()

    return inject


def _inject_every_step(env: ConformanceEnv, start: int, count: int = 1,
                       only: Callable[[ProposedBatch], bool] = lambda batch: True):  # noqa: ANN202
    """An inject script: ``count`` fresh samples into every step that may take them (prefill steps only on hosts
    without mixed batches), ids and tokens drawn from ``start`` on."""
    counter = iter(range(start, start * 10))

    def inject(batch: ProposedBatch):  # noqa: ANN202
        caps = env.host.capabilities()  # type: ignore[attr-defined]
        if (not caps.mixed_batches and not batch.has_prefill) or not only(batch):
            return ()
        return make_samples(env, count, seed=next(counter), first_id=next(counter) * 10)

    return inject


def run_check(env: ConformanceEnv, c: Check) -> None:
    """Run one check with clean hooks before and after (so one failing check cannot poison the next).

    A failure names the check, the documented rule(s) it enforces, and the seed that replays it."""
    from .rules import rules_for

    env.install(None)
    try:
        c(env)
    except AssertionError as exc:
        mine = rules_for(c.name)
        hook = getattr(exc, "hook", None)
        homes = _RULE_HOMES.get(hook or "", (f"HostHooks.{hook}",))
        quoted = [r for r in mine if r.where.startswith(homes)] or mine
        rules = "; ".join(f"{r.where}: \"{r.sentence}\"" for r in quoted) or "(no documented rule)"
        raise AssertionError(f"[{c.name}] {exc}\n  rule: {rules}\n  replay: deltaserve conformance {env.host_name} "
                             f"--seed {env.seed} --profile {env.profile} -- -k {c.name}") from exc
    finally:
        env.install(None)


# ------------------------------------------------------------------------------------------ protocol


@check("protocol")
def check_protocol__validate_host(env: ConformanceEnv) -> None:
    """The host passes validate_host: every member present with the protocol's signature."""
    try:
        validate_host(env.host)
    except HostProtocolError as exc:
        raise _fail(env, exc.member, f"validate_host rejects the host: {exc.rule}") from exc


# ------------------------------------------------------------------------------------------ intercept_schedule


@check("intercept_schedule")
def check_intercept_schedule__once_per_step(env: ConformanceEnv) -> None:
    """Called exactly once per executed step, before it, with the composition the host then ran; once also for a
    step whose samples do not fit what its client rows left of the token budget."""
    rec = Recorder()
    env.install(rec)
    env.run(make_prompts(env, 5, seed=1))
    ids = [b.step_id for b in rec.batches]
    if len(ids) != len(set(ids)):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise _fail(env, "intercept_schedule", f"on_schedule was called more than once for step(s) {dup}")
    records = rec.real_records()
    if not records:
        raise _fail(env, "intercept_schedule", "no step was reported while serving 5 requests")
    for r in records:
        batch = rec.batch_for(r.step_id)
        if batch is None:
            raise _fail(env, "intercept_schedule", f"step {r.step_id} executed without on_schedule being called first")
        ran = (tuple(sorted(r.prefill_lengths)), r.num_decode, r.kv_tokens)
        if _composition(batch) != ran:
            raise _fail(env, "intercept_schedule", f"step {r.step_id} was proposed as (prefill lengths, decodes, KV) "
                        f"{_composition(batch)} but ran as {ran}: the batch offered must be the batch dispatched")
    empty_steps = {b.step_id for b in rec.batches if not b.is_empty} - {r.step_id for r in records}
    if empty_steps:
        raise _fail(env, "intercept_schedule", f"steps {sorted(empty_steps)} were proposed with requests but never ran")
    # Once per step also when the answer does not fit: samples over what a full step's client rows leave of the
    # token budget are refused in that step's record (or run), never answered by asking again for the same step.
    # This interceptor answers every time it is asked, as the core's admission does.
    prompts, each = _budget_filling_prompts(env, 41)
    asked = iter(range(10**6))

    def every_prefill(batch: ProposedBatch):  # noqa: ANN202
        if not batch.has_prefill:
            return ()
        k = next(asked)
        return make_samples(env, 2, lengths=[each, each], seed=410 + k, first_id=4100 + 10 * k)

    over = Recorder(inject=every_prefill)
    env.install(over)
    env.run(prompts)
    ids = [b.step_id for b in over.batches]
    if len(ids) != len(set(ids)):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        budget = env.config.max_batch_tokens if env.config is not None else 2048
        raise _fail(env, "intercept_schedule", f"on_schedule was called {max(ids.count(i) for i in dup)} times for "
                    f"step(s) {dup}, whose samples ({2 * each} tokens) did not fit what its client rows left of "
                    f"max_batch_tokens={budget}; expected exactly one call per step (refuse what does not fit in "
                    "that step's record, never ask again)")


@check("intercept_schedule")
def check_intercept_schedule__injected_rows_run_in_same_step(env: ConformanceEnv) -> None:
    """Injected samples run in the very step they were returned for, once, as fine-tuning rows."""
    samples = make_samples(env, 3, lengths=[5, 9, 14])
    rec = Recorder(inject=_inject_into_first_prefill(samples))
    env.install(rec)
    env.run(make_prompts(env, 4, seed=2))
    if not rec.injected:
        raise _fail(env, "intercept_schedule", "no step with prefill was offered to on_schedule")
    (step_id, injected), = rec.injected.items()
    record = rec.record_for(step_id)
    want = sorted(s.sample_id for s in injected)
    if record is None:
        raise _fail(env, "intercept_schedule", f"step {step_id}, which received the injection, was never reported")
    if sorted(record.finetune_sample_ids) != want:
        raise _fail(env, "intercept_schedule", f"samples {want} were injected into step {step_id} but its record lists "
                    f"fine-tuning rows {sorted(record.finetune_sample_ids)}: they must run in that same step")
    if sorted(record.finetune_lengths) != sorted(s.num_tokens for s in injected):
        raise _fail(env, "intercept_schedule", f"step {step_id} ran fine-tuning rows of lengths "
                    f"{sorted(record.finetune_lengths)}, injected {sorted(s.num_tokens for s in injected)}: "
                    "every token of a sample is a prefill row")
    later = [r.step_id for r in rec.real_records() if r.step_id != step_id and set(r.finetune_sample_ids) & set(want)]
    if later:
        raise _fail(env, "intercept_schedule", f"injected samples ran again in steps {later}: they must be retired "
                    "after one forward")


@check("intercept_schedule")
def check_intercept_schedule__no_finetune_row_reaches_client(env: ConformanceEnv) -> None:
    """Clients receive exactly one output per client request, never one for a fine-tuning row."""
    rec = Recorder(inject=_inject_every_step(env, 1000, 2))
    env.install(rec)
    requests = make_prompts(env, 4, seed=3)
    outputs = env.run_stepwise(requests)
    got = sorted(o.request_id for o in outputs)
    want = sorted(r.request_id for r in requests)
    if got != want:
        extra = sorted(set(got) - set(want))
        raise _fail(env, "intercept_schedule", f"clients received outputs for {got}, expected exactly {want}"
                    + (f"; {extra} are not client requests (fine-tuning rows leaked)" if extra else ""))
    if not rec.injected:
        raise _fail(env, "intercept_schedule", "the check could not inject any fine-tuning row")


@check("intercept_schedule")
def check_intercept_schedule__outputs_unchanged_by_injection(env: ConformanceEnv) -> None:
    """Greedy client outputs are identical with and without fine-tuning rows in their steps."""
    requests = make_prompts(env, 5, seed=4, max_tokens=8)
    baseline = env.run(requests)
    rec = Recorder(inject=_inject_every_step(env, 5000, 2))
    env.install(rec)
    mixed = env.run(requests)
    for a, b in zip(baseline, mixed):
        if a.token_ids != b.token_ids:
            raise _fail(env, "intercept_schedule", f"request {a.request_id} produced {list(b.token_ids)} with fine-tuning "
                        f"rows in its steps but {list(a.token_ids)} without: co-serving must not change client outputs")


@check("intercept_schedule")
def check_intercept_schedule__declining_leaves_batch_unchanged(env: ConformanceEnv) -> None:
    """An interceptor that injects nothing leaves every step and every output as without one."""
    # Shapes are compared on prompts of equal lengths but different tokens: a host with a prefix cache would
    # otherwise (rightly) prefill less the second time.
    plain = Recorder()
    env.host.report_step_time(plain)  # type: ignore[attr-defined]
    baseline = env.run(make_prompts(env, 5, seed=5, token_salt=1))
    env.install(None)
    rec = Recorder()
    env.install(rec)
    env.run(make_prompts(env, 5, seed=5, token_salt=2))
    shape = [(tuple(sorted(r.prefill_lengths)), r.num_decode, r.kv_tokens) for r in plain.real_records()]
    shape2 = [(tuple(sorted(r.prefill_lengths)), r.num_decode, r.kv_tokens) for r in rec.real_records()]
    if shape != shape2:
        raise _fail(env, "intercept_schedule", f"with a declining interceptor the steps ran as {shape2}, without one as "
                    f"{shape}: installing the hook must not change scheduling")
    declined = env.run(make_prompts(env, 5, seed=5, token_salt=1))
    if [o.token_ids for o in baseline] != [o.token_ids for o in declined]:
        raise _fail(env, "intercept_schedule", "outputs differ with a declining interceptor installed")


@check("intercept_schedule")
def check_intercept_schedule__reserved_adapter_refused(env: ConformanceEnv) -> None:
    """A client request naming the reserved adapter is refused with ReservedAdapterError."""
    request = ClientRequest("client-reserved", (5, 6, 7), 2, adapter=RESERVED_ADAPTER_NAME)
    try:
        env.host.submit(request)  # type: ignore[attr-defined]
    except ReservedAdapterError:
        pass
    else:
        leftover = env.host.has_unfinished()  # type: ignore[attr-defined]
        if leftover:
            env.run_stepwise([])
        raise _fail(env, "intercept_schedule", f"a client request on {RESERVED_ADAPTER_NAME!r} was accepted; it must "
                    "raise deltaserve_core.hooks.ReservedAdapterError")
    if env.host.has_unfinished():  # type: ignore[attr-defined]
        raise _fail(env, "intercept_schedule", "the refused request was queued anyway")


# ------------------------------------------------------------------------------------------ capture_activation


def _reference_layer_inputs(env: ConformanceEnv, input_ids: tuple[int, ...]) -> list[torch.Tensor]:
    """Residual-stream input of every decoder layer from plain transformers + PEFT (fp32, CPU)."""
    return env.independent.layer_inputs(env.finetune_state, input_ids)


@check("capture_activation")
def check_capture_activation__matches_reference_forward(env: ConformanceEnv) -> None:
    """Captured layer inputs of fine-tuning rows equal a plain transformers + PEFT forward of the same tokens."""
    samples = make_samples(env, 2, lengths=[7, 12], seed=7)
    rec = Recorder(inject=_inject_into_first_prefill(samples))
    env.install(rec)
    env.run(make_prompts(env, 3, seed=7))
    if not rec.captures:
        raise _fail(env, "capture_activation", "no layer input was delivered for the injected samples")
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    for s in samples:
        ref = _reference_layer_inputs(env, s.input_ids)
        got = {layer: t for _, layer, sid, t in rec.captures if sid == s.sample_id}
        missing = sorted(set(range(num_layers)) - set(got))
        if missing:
            raise _fail(env, "capture_activation", f"sample {s.sample_id}: no capture for layers {missing}")
        for layer in range(num_layers):
            t = got[layer]
            if tuple(t.shape) != tuple(ref[layer].shape):
                raise _fail(env, "capture_activation", f"sample {s.sample_id} layer {layer}: captured shape "
                            f"{tuple(t.shape)}, expected [num_tokens, hidden] = {tuple(ref[layer].shape)}")
            err = (t - ref[layer]).abs().max().item()
            bound = env.tolerance * (1.0 + ref[layer].abs().max().item())
            if err > bound:
                raise _fail(env, "capture_activation", f"sample {s.sample_id} layer {layer}: captured input differs from "
                            f"the transformers+PEFT reference by {err:.3g} (allowed {bound:.3g} for {env.dtype}); "
                            "capture the residual-stream input *before* the layer runs, on the reserved adapter")


@check("capture_activation")
def check_capture_activation__only_finetune_rows_in_layer_order(env: ConformanceEnv) -> None:
    """Exactly one capture per (layer, fine-tuning sample), in layer order, between begin_step and end_step."""
    samples = make_samples(env, 2, lengths=[6, 8], seed=8, first_id=70)
    rec = Recorder(inject=_inject_into_first_prefill(samples))
    env.install(rec)
    env.run(make_prompts(env, 3, seed=8))
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    ids = {s.sample_id: s for s in samples}
    foreign = sorted({sid for _, _, sid, _ in rec.captures if sid not in ids})
    if foreign:
        raise _fail(env, "capture_activation", f"captures were delivered for ids {foreign}, which are not fine-tuning "
                    "rows: inference rows must never be captured")
    keys = [(layer, sid) for _, layer, sid, _ in rec.captures if sid in ids]
    want = sorted((layer, sid) for layer in range(num_layers) for sid in ids)
    if sorted(keys) != want:
        raise _fail(env, "capture_activation", f"expected one capture per (layer, sample) = {len(want)}, got {len(keys)}")
    layers_seen = [layer for layer, _ in keys]
    if layers_seen != sorted(layers_seen):
        raise _fail(env, "capture_activation", f"captures arrived in layer order {layers_seen}; they must be in order")
    for _, _, sid, t in rec.captures:
        if t.shape[0] != ids[sid].num_tokens:
            raise _fail(env, "capture_activation", f"sample {sid}: captured {t.shape[0]} rows, it has "
                        f"{ids[sid].num_tokens} tokens")
    begun = [s for s, x in rec.begun if set(x) & set(ids)]
    if len(begun) != 1 or sorted(next(x for s, x in rec.begun if s == begun[0])) != sorted(ids):
        raise _fail(env, "capture_activation", f"begin_step should be called once with samples {sorted(ids)}; calls: "
                    f"{rec.begun}")
    step_id = begun[0]
    ended = [e for e in rec.ended if e[0] == step_id]
    if len(ended) != 1 or sorted(ended[0][1]) != sorted(ids) or ended[0][2]:
        raise _fail(env, "capture_activation", f"end_step for step {step_id} should report completed={sorted(ids)}, "
                    f"aborted=[]; got {ended}")


def _needs_abort(caps: HostCapabilities) -> str | None:
    return None if caps.supports_abort else "host declares supports_abort=False"


@check("capture_activation", requires=_needs_abort)
def check_capture_activation__abort_stops_finetune_only_step(env: ConformanceEnv) -> None:
    """should_abort=True at a layer boundary stops a fine-tuning-only step there and hands the samples back. Its
    record's ``duration_s`` is the wall time of the part that ran (layer 0 did), so above 0: a host that takes the
    duration from an end-of-forward timing event an aborted forward never reaches reports 0, and the latency model
    never sees that time (blind batch 2026-12-07b, h24)."""
    samples = make_samples(env, 2, lengths=[10, 12], seed=9, first_id=90)
    fired: list[int] = []
    rec = Recorder(inject=_inject_into_first_idle(samples, fired), abort_after_layer=1)
    env.install(rec)
    env.host.run_idle_step()  # type: ignore[attr-defined]
    if not fired:
        raise _fail(env, "capture_activation", "run_idle_step() did not offer an empty batch to on_schedule, so no "
                    "fine-tuning-only step could be issued")
    step_id = fired[0]
    layers_after = sorted({layer for s, layer, _, _ in rec.captures if s == step_id and layer >= 1})
    if layers_after:
        raise _fail(env, "capture_activation", f"should_abort returned True at the boundary before layer 1 but layers "
                    f"{layers_after} still ran: stop at the next layer boundary")
    ids = sorted(s.sample_id for s in samples)
    ended = [e for e in rec.ended if e[0] == step_id]
    if not ended or sorted(ended[-1][2]) != ids or ended[-1][1]:
        raise _fail(env, "capture_activation", f"end_step must report aborted={ids}, completed=[]; got {ended}")
    record = rec.record_for(step_id)
    if record is None or sorted(record.aborted_sample_ids) != ids or record.finetune_sample_ids:
        raise _fail(env, "capture_activation", f"the step record must list aborted_sample_ids={ids} and no completed "
                    f"fine-tuning rows; got {record}")
    if not record.duration_s > 0:
        raise _fail(env, "capture_activation", f"the record of a fine-tuning-only step aborted before layer 1 (layer 0 "
                    f"ran) has duration_s={record.duration_s!r}; expected the wall time of the part that ran, above 0")


@check("driver", requires=_needs_abort)
def check_driver__run_idle_step_true_for_an_aborted_step(env: ConformanceEnv) -> None:
    """A fine-tuning-only idle step aborted at a layer boundary ran (its record, with the samples aborted, reaches
    the step sink), so ``run_idle_step()`` answers True for it: the answer says whether a step executed, not whether
    it completed a sample. The core aborts such a step whenever a client arrives during it."""
    samples = make_samples(env, 1, lengths=[9], seed=148, first_id=4800)
    fired: list[int] = []
    rec = Recorder(inject=_inject_into_first_idle(samples, fired), abort_after_layer=1)
    env.install(rec)
    ran = env.host.run_idle_step()  # type: ignore[attr-defined]
    record = rec.record_for(fired[0]) if fired else None
    if record is not None and record.aborted_sample_ids and ran is not True:
        raise _fail(env, "driver", f"run_idle_step() returned {ran!r} for a fine-tuning-only step that ran and was "
                    f"aborted (its record: {record}); expected True: a step executed")


# ------------------------------------------------------------------------------------------ report_step_time


@check("report_step_time")
def check_report_step_time__one_record_per_step(env: ConformanceEnv) -> None:
    """Exactly one record per executed step, in step order, none for a step that did not run."""
    rec = Recorder(inject=_inject_into_first_prefill(make_samples(env, 1, first_id=300)))
    env.install(rec)
    env.run(make_prompts(env, 4, seed=10))
    ids = [r.step_id for r in rec.real_records()]
    if len(ids) != len(set(ids)):
        raise _fail(env, "report_step_time", f"step ids reported more than once: {sorted({i for i in ids if ids.count(i) > 1})}")
    if ids != sorted(ids):
        raise _fail(env, "report_step_time", f"records arrived out of step order: {ids}")
    ran = {b.step_id for b in rec.batches if not b.is_empty or b.step_id in rec.injected}
    if set(ids) != ran:
        raise _fail(env, "report_step_time", f"steps {sorted(ran - set(ids))} ran without a record; records "
                    f"{sorted(set(ids) - ran)} have no step")


@check("report_step_time")
def check_report_step_time__consistent_with_wall_clock(env: ConformanceEnv) -> None:
    """Durations are positive, fit inside the wall-clock window and do not overlap."""
    rec = Recorder()
    env.install(rec)
    start = time.monotonic()
    env.run(make_prompts(env, 4, seed=11, max_tokens=8))
    end = time.monotonic()
    records = list({r.step_id: r for r in reversed(rec.real_records())}.values())[::-1]  # counting is another check
    slack = 2e-3
    for r in records:
        if not r.duration_s > 0:
            raise _fail(env, "report_step_time", f"step {r.step_id} reports duration {r.duration_s}")
        if r.start_time < start - slack or r.start_time + r.duration_s > end + slack:
            raise _fail(env, "report_step_time", f"step {r.step_id} claims [{r.start_time - start:.4f}, "
                        f"{r.start_time + r.duration_s - start:.4f}] s, outside the {end - start:.4f} s the run took")
    for a, b in zip(records, records[1:]):
        if a.start_time + a.duration_s > b.start_time + slack:
            raise _fail(env, "report_step_time", f"steps {a.step_id} and {b.step_id} overlap in time: "
                        "durations must be device-complete times of one step")
    total = sum(r.duration_s for r in records)
    if total > (end - start) + slack:
        raise _fail(env, "report_step_time", f"reported step times sum to {total:.4f} s, more than the "
                    f"{end - start:.4f} s wall clock")


@check("report_step_time")
def check_report_step_time__profile_step_reports_its_shape(env: ConformanceEnv) -> None:
    """run_profile_step executes the requested shape and reports it (synthetic) to the sink too."""
    rec = Recorder()
    env.install(rec)
    # A host without mixed batches never runs prefill and decode rows in one step, so calibration never asks it to.
    decodes = 3 if env.host.capabilities().mixed_batches else 0  # type: ignore[attr-defined]
    shape = ProfileShape(prefill_lengths=(16, 8), num_decode=decodes, decode_context=20, finetune_lengths=(6,))
    got = env.host.run_profile_step(shape)  # type: ignore[attr-defined]
    if not got.synthetic:
        raise _fail(env, "report_step_time", "run_profile_step returned a record without synthetic=True")
    want = ((8, 16), decodes, 20 * decodes, (6,))
    have = (tuple(sorted(got.prefill_lengths)), got.num_decode, got.kv_tokens, tuple(got.finetune_lengths))
    if have != want:
        raise _fail(env, "report_step_time", f"profile step ran (prefill, decodes, KV, FT lengths) = {have}, asked {want}")
    if got not in rec.records:
        raise _fail(env, "report_step_time", "the profile step's record was not delivered to the step sink")


# ------------------------------------------------------------------------------------------ graph_mode


@check("graph_mode")
def check_graph_mode__agrees_with_execution(env: ConformanceEnv) -> None:
    """graph_mode(batch) is what the step then ran in (steps without fine-tuning rows)."""
    rec = Recorder()
    env.install(rec)
    env.run(make_prompts(env, 4, seed=12, max_tokens=6))
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    for r in rec.real_records():
        batch = rec.batch_for(r.step_id)
        if batch is None:
            continue
        predicted = env.host.graph_mode(batch)  # type: ignore[attr-defined]
        if predicted is not r.mode or batch.mode is not r.mode:
            raise _fail(env, "graph_mode", f"step {r.step_id}: graph_mode() says {predicted.value}, the batch was "
                        f"proposed as {batch.mode.value}, the step ran {r.mode.value}")
        if r.mode not in caps.graph_modes:
            raise _fail(env, "graph_mode", f"step {r.step_id} ran {r.mode.value}, not among declared graph_modes")


@check("graph_mode")
def check_graph_mode__finetune_steps_are_eager(env: ConformanceEnv) -> None:
    """A step carrying fine-tuning rows never runs as a graph replay (capture hooks would not fire)."""
    rec = Recorder(inject=_inject_every_step(env, 7000, 1))
    env.install(rec)
    env.run(make_prompts(env, 3, seed=13, max_tokens=6))
    ft_steps = [r for r in rec.real_records() if r.finetune_sample_ids]
    if not ft_steps:
        raise _fail(env, "graph_mode", "no step carried fine-tuning rows")
    graph = [r.step_id for r in ft_steps if r.mode is not ExecutionMode.EAGER]
    if graph:
        raise _fail(env, "graph_mode", f"steps {graph} carried fine-tuning rows but ran as graph replays")


# ------------------------------------------------------------------------------------------ publish


@check("publish_adapter")
def check_publish_adapter__serves_published_weights(env: ConformanceEnv) -> None:
    """Weights published with publish_adapter are served under the returned name: greedy outputs equal plain
    transformers + PEFT loading the same weights."""
    from deltaserve_core.adapter_state import LoraAdapterState

    state = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-published", version=1)
    name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
    if not isinstance(name, str) or not name or name == RESERVED_ADAPTER_NAME:
        raise _fail(env, "publish_adapter", f"returned {name!r}; it must return a client-visible adapter name")
    requests = [ClientRequest(r.request_id + "-pub", r.prompt_ids, r.max_tokens, adapter=name)
                for r in make_prompts(env, 4, seed=14, adapter_every=1)]
    # Judged against transformers + PEFT loading the published weights, not against the host's own client-adapter
    # path: a LoRA scaling slip shared by both host paths would cancel out in that comparison.
    problems = _greedy_problems(env, env.run(requests), requests, lambda r: state)
    if problems:
        raise _fail(env, "publish_adapter", f"adapter published as {name!r}: expected transformers+PEFT's greedy "
                    "outputs for the published weights; " + "; ".join(problems[:3]))


#: Versions published by the check below: more than any engine's default adapter slots per step (VllmHost 4, the
#: reserved one included; `vllm serve` max_loras + 1; SGLang 4), so a host with a fixed slot count runs the check
#: with every slot taken.
_PUBLISHED_VERSIONS = 8


@check("publish_adapter")
def check_publish_adapter__base_rows_unchanged_when_every_adapter_slot_is_taken(env: ConformanceEnv) -> None:
    """After many published versions, base-model requests that share steps with adapter rows still get the base
    model's greedy outputs (an engine that fills adapter slots by index must not hand the last slot's adapter to
    rows that have none). Fine-tuning rows make such steps common; the reserved adapter holds a slot throughout."""
    from deltaserve_core.adapter_state import LoraAdapterState

    base = make_prompts(env, 4, seed=16, max_tokens=8, adapter_every=0, prefix="base-only")
    baseline = env.run(base)
    state = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-slots")
    names = []
    for version in range(1, _PUBLISHED_VERSIONS + 1):
        # Distinct weights per version, each far from zero: a version applied where it does not belong shows.
        tensors = {k: v * (1.0 + version / 4) for k, v in state.tensors.items()}
        names.append(env.host.publish_adapter(state.with_tensors(tensors, version=version)))  # type: ignore[attr-defined]
    adapted = [ClientRequest(f"slots-{i}", r.prompt_ids, r.max_tokens, adapter=names[-1 - i] if i % 2 else
                             env.client_adapter) for i, r in enumerate(make_prompts(env, 4, seed=17, max_tokens=8))]
    outputs = {o.request_id: o.token_ids for o in env.run([*base, *adapted])}
    for want in baseline:
        got = outputs[want.request_id]
        if got != want.token_ids:
            raise _fail(env, "publish_adapter", f"base-model request {want.request_id} generated {list(got)} next to "
                        f"adapter rows after {_PUBLISHED_VERSIONS} published versions, but "
                        f"{list(want.token_ids)} on its own: rows without an adapter must get no adapter's delta")


@check("publish_adapter")
def check_publish_adapter__every_version_in_one_step_serves_its_weights(env: ConformanceEnv) -> None:
    """Requests on more distinct published versions than any engine's default adapter slots per step, all submitted
    together, each get transformers + PEFT's greedy tokens for their own version: an engine that maps only the
    first few adapters of a step (a LoRA mapping sized by its slot count) must defer the other rows, not run them on
    the base model or on another version's weights."""
    from deltaserve_core.adapter_state import LoraAdapterState

    source = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-many")
    versions: dict[str, LoraAdapterState] = {}
    for version in range(1, 7):
        tensors = {k: v * (1.0 + version / 4) for k, v in source.tensors.items()}
        state = source.with_tensors(tensors, version=version)
        versions[env.host.publish_adapter(handed_copy(state))] = state  # type: ignore[attr-defined]
    prompts = make_prompts(env, len(versions), seed=19, max_tokens=5, adapter_every=0, prefix="many-versions")
    requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=name)
                for r, name in zip(prompts, versions)]
    problems = _greedy_problems(env, env.run(requests), requests, lambda r: versions[r.adapter])
    if problems:
        raise _fail(env, "publish_adapter", f"{len(versions)} published versions, one request each, submitted "
                    "together: expected each version's transformers+PEFT greedy outputs; " + "; ".join(problems[:3]))


# ------------------------------------------------------------------------------------------ rules the first suite
# recorded but never asserted, or tried with one spelling only (issue #15)


@check("capabilities")
def check_capabilities__constant_for_the_host_lifetime(env: ConformanceEnv) -> None:
    """capabilities() returns the same value before, during and after serving (the core reads it once)."""
    first = env.host.capabilities()  # type: ignore[attr-defined]
    rec = Recorder(inject=_inject_into_first_prefill(make_samples(env, 2, first_id=400, seed=40)))
    seen: list[HostCapabilities] = []
    inner = rec.on_schedule

    def on_schedule(batch: ProposedBatch):  # noqa: ANN202
        seen.append(env.host.capabilities())  # type: ignore[attr-defined]
        return inner(batch)

    rec.on_schedule = on_schedule  # type: ignore[method-assign]
    env.install(rec)
    env.run(make_prompts(env, 3, seed=40))
    seen.append(env.host.capabilities())  # type: ignore[attr-defined]
    changed = [c for c in seen if c != first]
    if changed:
        raise _fail(env, "capabilities", f"expected the same HostCapabilities for the host's lifetime; got {first} "
                    f"at start-up and {changed[0]} while serving")


@check("intercept_schedule")
def check_intercept_schedule__on_arrival_once_per_client_request(env: ConformanceEnv) -> None:
    """on_arrival is called once per client request, with its id, at submit time, before the request is scheduled,
    and never for fine-tuning rows: for requests sent with ``submit`` and for those sent with ``generate`` (engines
    often add a batch of requests through another path than a single one)."""
    rec = Recorder(inject=_inject_into_first_prefill(make_samples(env, 2, first_id=500, seed=50)))
    env.install(rec)
    requests = make_prompts(env, 4, seed=50, prefix="arrival")
    windows: dict[str, tuple[float, float]] = {}
    outputs = []
    for i, r in enumerate(requests):
        before = time.monotonic()
        env.host.submit(r)  # type: ignore[attr-defined]
        windows[r.request_id] = (before, time.monotonic())
        if i % 2:  # arrivals between steps too, not only before the first one
            outputs.extend(env.host.step())  # type: ignore[attr-defined]
    outputs.extend(env.run_stepwise([]))
    # generate() accepts its requests when called: each arrival lies within the call (and before its scheduling,
    # checked below with the submitted ones)
    generated = make_prompts(env, 3, seed=51, max_tokens=3, prefix="arrival-generate")
    before = time.monotonic()
    env.run(generated)
    windows.update((r.request_id, (before, time.monotonic())) for r in generated)
    got = [rid for rid, _ in rec.arrivals]
    want = [r.request_id for r in requests + generated]
    if sorted(got) != sorted(want):
        missing = sorted(set(want) - set(got))
        via = sorted({"generate()" if m.startswith("arrival-generate") else "submit()" for m in missing})
        raise _fail(env, "intercept_schedule", f"expected on_arrival once for each of {want} (the first 4 sent with "
                    f"submit(), the last 3 with generate()); it was called for {got}"
                    + (f": none for {missing}, sent with {' and '.join(via)}" if missing else ""))
    for rid, t in rec.arrivals:
        lo, hi = windows[rid]
        if not lo - 1e-3 <= t <= hi + 1e-3:
            raise _fail(env, "intercept_schedule", f"on_arrival({rid!r}) carried arrival_time {t:.6f}, expected the "
                        f"submit time, within [{lo:.6f}, {hi:.6f}] (time.monotonic() of the scheduling process)")
    for i, b in enumerate(rec.batches):
        for r in b.scheduled:
            told = rec.arrived_before_batch.get(r.request_id)
            if told is not None and told > i:
                raise _fail(env, "intercept_schedule", f"{r.request_id} was scheduled in step {b.step_id} before "
                            "on_arrival told the core it had arrived; expected on_arrival first (at submit)")


def _call_order_problems(rec: Recorder) -> list[str]:
    """Violations of the per-step call order: on_schedule, then (steps with fine-tuning rows) begin_step, the layer
    inputs in layer order, end_step, then the record; sink calls only for steps that carry fine-tuning rows."""
    problems: list[str] = []
    by_step: dict[int, list[str]] = {}
    for kind, step in rec.events:
        by_step.setdefault(step, []).append(kind)
    for step, kinds in by_step.items():
        if step < 0:
            continue
        ft = step in rec.injected
        if kinds[:1] != ["schedule"] and "schedule" in kinds:
            problems.append(f"step {step}: {kinds[0]} came before on_schedule (calls: {kinds})")
        if not ft:
            sink_calls = [k for k in kinds if k in ("begin", "layer", "end")]
            if sink_calls:
                problems.append(f"step {step} carried no fine-tuning rows but the activation sink got {sink_calls}")
            continue
        if "begin" not in kinds:
            record = rec.record_for(step)
            refused = (record is not None and not record.finetune_sample_ids and
                       set(record.aborted_sample_ids) >= {s.sample_id for s in rec.injected[step]})
            if refused and not any(k in ("layer", "poll", "end") for k in kinds):
                continue  # every row refused in the record before the forward (past the running slots): none ran
            problems.append(f"step {step} carried fine-tuning rows but begin_step was never called")
            continue
        if kinds.count("begin") != 1:
            problems.append(f"step {step}: begin_step called {kinds.count('begin')} times, expected once")
        first_begin = kinds.index("begin")
        early = [k for k in kinds[:first_begin] if k in ("layer", "poll", "end")]
        if early:
            problems.append(f"step {step}: {early} came before begin_step (expected begin_step before layer 0)")
        if "end" in kinds:
            last_end = len(kinds) - 1 - kinds[::-1].index("end")
            late = [k for k in kinds[last_end + 1:] if k in ("layer", "poll", "begin")]
            if late:
                problems.append(f"step {step}: {late} came after end_step")
            if "record" in kinds and kinds.index("record") < last_end:
                problems.append(f"step {step}: its StepRecord was delivered before end_step")
        else:
            problems.append(f"step {step} carried fine-tuning rows but end_step was never called")
        layers = [layer for s, layer, _, _ in rec.captures if s == step]
        if layers != sorted(layers):
            problems.append(f"step {step}: layer inputs arrived in order {layers}, expected layer order")
    return problems


@check("capture_activation")
def check_capture_activation__call_order(env: ConformanceEnv) -> None:
    """Per step: on_schedule; for steps with fine-tuning rows begin_step (once, before layer 0), layer inputs in
    layer order, end_step, then the record; no sink call for a step without fine-tuning rows."""
    offered = iter(range(10**6))  # every other injectable step, so steps without fine-tuning rows are seen too
    rec = Recorder(inject=_inject_every_step(env, 600, 2, only=lambda batch: next(offered) % 2 == 0))
    env.install(rec)
    env.run(make_prompts(env, 4, seed=60))
    if not rec.injected:
        raise _fail(env, "capture_activation", "the check could not inject any fine-tuning row")
    problems = _call_order_problems(rec)
    if problems:
        raise _fail(env, "capture_activation", "expected on_schedule → begin_step → layer inputs → end_step → record "
                    "per step; got: " + "; ".join(problems[:4]))


def _tensor_digest(state) -> str:  # noqa: ANN001
    return digest(sorted((k, v.detach().cpu().numpy().tobytes()) for k, v in state.tensors.items()))


@check("intercept_schedule")
def check_intercept_schedule__inputs_not_mutated(env: ConformanceEnv) -> None:
    """The host never mutates what the core hands it: the ProposedBatch it built and offered, the sequence of
    samples on_schedule returned, and the adapter weights given to set_finetune_adapter and publish_adapter."""
    ft = handed_copy(env.finetune_state)
    pub = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-immutable", version=3)
    before_ft, before_pub = _tensor_digest(ft), _tensor_digest(pub)
    rec = Recorder(inject=_inject_every_step(env, 800, 3))
    try:
        env.host.set_finetune_adapter(ft)  # type: ignore[attr-defined]
        name = env.host.publish_adapter(pub)  # type: ignore[attr-defined]
        env.install(rec)
        requests = make_prompts(env, 4, seed=80)
        requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=name if i % 2 else r.adapter)
                    for i, r in enumerate(requests)]
        env.run(requests)
    finally:
        env.install(None)
        env.host.set_finetune_adapter(handed_copy(env.finetune_state))  # type: ignore[attr-defined]
    for step_id, (was, batch, handed, original) in rec.offered.items():
        if digest(batch) != was:
            raise _fail(env, "intercept_schedule", f"step {step_id}: the ProposedBatch offered to on_schedule changed "
                        f"after the call (expected it unchanged: the core keeps it to price the step); now {batch}")
        if tuple(handed) != original:
            raise _fail(env, "intercept_schedule", f"step {step_id}: on_schedule returned samples "
                        f"{[s.sample_id for s in original]} and the host changed that sequence to "
                        f"{[s.sample_id for s in handed]}; copy it instead of consuming it")
        if not isinstance(batch.scheduled, tuple) or not isinstance(batch.waiting, tuple):
            raise _fail(env, "intercept_schedule", f"step {step_id}: ProposedBatch.scheduled/waiting must be tuples "
                        f"(immutable), got {type(batch.scheduled).__name__}/{type(batch.waiting).__name__}")
    if _tensor_digest(ft) != before_ft:
        raise _fail(env, "set_finetune_adapter", "the weights passed to set_finetune_adapter were modified in place "
                    "by the host; expected them unchanged (the core keeps training those tensors)")
    if _tensor_digest(pub) != before_pub:
        raise _fail(env, "publish_adapter", "the weights passed to publish_adapter were modified in place by the host; "
                    "expected them unchanged")


@check("report_step_time")
def check_report_step_time__duration_not_below_device_time(env: ConformanceEnv) -> None:
    """A step's duration covers its device work: never below a tenth of a plain forward of the same prefills
    (a clock stopped at launch, or before the last layer, reports less)."""
    limit = (env.config.max_batch_tokens if env.config else 2048)
    n = max(16, min(400, limit // 5))
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    # A clock stopped early reports too little every time; a machine busy with other work can slow the reference
    # forward (or speed nothing) once. So the step is judged up to three times and fails only if every try does.
    for attempt in range(3):
        rec = Recorder()
        env.install(rec)
        requests = make_prompts(env, 4, seed=90 + attempt, max_tokens=1, prefix=f"lower-bound-{attempt}")
        requests = [ClientRequest(r.request_id, tuple((r.prompt_ids * (n // len(r.prompt_ids) + 1))[:n]), 1)
                    for r in requests]
        env.run(requests)
        prefill_steps = [r for r in rec.real_records() if r.prefill_lengths]
        if not prefill_steps:
            raise _fail(env, "report_step_time", "no prefill step was reported")
        biggest = max(prefill_steps, key=lambda r: sum(r.prefill_lengths))
        ref = env.independent.forward_seconds(biggest.prefill_lengths, caps.device, env.vocab_size)
        if biggest.duration_s >= _LOWER_BOUND_FRACTION * ref:
            return
    raise _fail(env, "report_step_time", f"step {biggest.step_id} (prefill lengths {list(biggest.prefill_lengths)})"
                f" reports {biggest.duration_s * 1e3:.3f} ms; a plain transformers forward of the same prefills "
                f"takes {ref * 1e3:.3f} ms on {caps.device}, and a device-complete step time is expected to be "
                f"at least {_LOWER_BOUND_FRACTION} of that (three tries): is the clock stopped before the device "
                "finishes?")


#: How much faster than eager transformers (same prefills, same device) an engine's step may claim to be. Engines
#: beat eager transformers, but a tenfold win on a two-layer model is a clock stopped early, not a kernel.
_LOWER_BOUND_FRACTION = 0.1


@check("capture_activation", requires=_needs_abort)
def check_capture_activation__abort_stops_compute(env: ConformanceEnv) -> None:
    """After should_abort returns True the host stops computing (not only capturing): end_step follows the True
    poll sooner than the host takes for one layer of the same step."""
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    total = min(caps.max_finetune_tokens_per_step, 1600)
    lengths = [total // 2, total - total // 2]

    def run(abort: int | None, first_id: int) -> Recorder:
        samples = make_samples(env, 2, lengths=lengths, seed=95, first_id=first_id)
        fired: list[int] = []
        rec = Recorder(inject=_inject_into_first_idle(samples, fired), abort_after_layer=abort)
        times: list[tuple[str, float]] = []
        poll, end = rec.should_abort, rec.end_step

        def timed_poll(step_id: int) -> bool:
            answer = poll(step_id)
            times.append(("poll-true" if answer else "poll", time.perf_counter()))
            return answer

        def timed_end(step_id: int, completed, aborted) -> None:  # noqa: ANN001
            times.append(("end", time.perf_counter()))
            end(step_id, completed, aborted)

        rec.should_abort, rec.end_step = timed_poll, timed_end  # type: ignore[method-assign]
        rec.times = times  # type: ignore[attr-defined]
        env.install(rec)
        env.host.run_idle_step()  # type: ignore[attr-defined]
        env.install(None)
        if not fired:
            raise _fail(env, "capture_activation", "run_idle_step() offered no empty batch: no fine-tuning-only step")
        return rec

    layer_times, abort_gaps = [], []
    for i in range(3):
        full = run(None, 9000 + 10 * i)
        polls = [t for k, t in full.times if k == "poll"]  # type: ignore[attr-defined]
        layer_times += [b - a for a, b in zip(polls, polls[1:])]
        aborted = run(0, 9500 + 10 * i)
        marks = aborted.times  # type: ignore[attr-defined]
        true_at = next((t for k, t in marks if k == "poll-true"), None)
        end_at = next((t for k, t in marks if k == "end"), None)
        if true_at is None or end_at is None:
            raise _fail(env, "capture_activation", f"expected should_abort polled at layer boundaries and end_step "
                        f"after an abort; got calls {[k for k, _ in marks]}")
        abort_gaps.append(end_at - true_at)
    if not layer_times:
        raise _fail(env, "capture_activation", "should_abort was polled at most once in a fine-tuning-only step; "
                    "expected a poll at every decoder-layer boundary")
    layer = sorted(layer_times)[len(layer_times) // 2]
    gap = min(abort_gaps)
    if gap > 0.5 * layer:
        raise _fail(env, "capture_activation", f"after should_abort returned True at the boundary before layer 0, "
                    f"end_step came {gap * 1e3:.2f} ms later; one layer of the same step takes {layer * 1e3:.2f} ms. "
                    "Expected the forward to stop at that boundary, not to keep computing without capturing")


#: Spellings a client might send that must not reach the reserved adapter: case and whitespace variants.
_RESERVED_VARIANTS = (RESERVED_ADAPTER_NAME.upper(), f" {RESERVED_ADAPTER_NAME}", f"{RESERVED_ADAPTER_NAME} ",
                      f"{RESERVED_ADAPTER_NAME}\n", RESERVED_ADAPTER_NAME.title())


@check("intercept_schedule")
def check_intercept_schedule__reserved_adapter_variants_refused(env: ConformanceEnv) -> None:
    """Case/whitespace variants of the reserved name, and the training adapter's own name, are refused too."""
    st = env.finetune_state
    for name in (*_RESERVED_VARIANTS, st.name, f"{st.name}@v{st.version}"):
        request = ClientRequest(f"client-variant-{len(name)}", (5, 6, 7), 2, adapter=name)
        try:
            env.host.submit(request)  # type: ignore[attr-defined]
        except ValueError:  # ReservedAdapterError, or the unknown-adapter error every host raises
            pass
        else:
            outputs = env.run_stepwise([])
            raise _fail(env, "intercept_schedule", f"expected a client request on adapter {name!r} refused (it "
                        f"names the reserved fine-tuning adapter {RESERVED_ADAPTER_NAME!r} or the training adapter "
                        f"{st.name!r}); it was accepted and produced {[list(o.token_ids) for o in outputs]}")
        if env.host.has_unfinished():  # type: ignore[attr-defined]
            env.run_stepwise([])
            raise _fail(env, "intercept_schedule", f"the request on {name!r} was refused but queued anyway")


def _prefix_samples(env: ConformanceEnv, template: tuple[int, ...], count: int, first_id: int,
                    seed: int) -> list:  # noqa: ANN001
    import random

    from deltaserve_core.types import FineTuneSample

    rng = random.Random(seed)
    out = []
    for i in range(count):
        tail = tuple(rng.randrange(3, env.vocab_size) for _ in range(rng.randint(3, 12)))
        ids = template + tail
        out.append(FineTuneSample(first_id + i, ids, (False,) * len(template) + (True,) * len(tail)))
    # Shortest first, as the fixed checks inject: row order is the generated scenarios' concern, not this check's.
    return sorted(out, key=lambda s: s.num_tokens)


#: a reduced-precision capture may differ from fp32 by this many times what the reference's own forward in that
#: dtype does (the factor of the training criterion, tests/test_coserve.assert_within_precision)
_NOISE_FACTOR = 2.0


def _dtype_noise(env: ConformanceEnv, state, input_ids, ref: list) -> list[float]:  # noqa: ANN001
    """Per layer, ``_NOISE_FACTOR`` times how far transformers + PEFT in the host's dtype lands from its fp32 forward
    (0 for an fp32 host): rounding compounds layer by layer, so a fixed relative bound that fits a 2-layer model is
    exceeded by a correct 12-layer one."""
    if env.dtype == "float32":
        return [0.0] * len(ref)
    import torch

    low = env.independent.layer_inputs(state, input_ids, dtype=getattr(torch, env.dtype))
    return [_NOISE_FACTOR * (a - b).abs().max().item() for a, b in zip(low, ref)]


def _capture_problems(env: ConformanceEnv, rec: Recorder, samples, state) -> list[str]:  # noqa: ANN001
    """Every sample captured once per layer, whole, and equal to transformers + PEFT under ``state``."""
    problems = []
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    for s in samples:
        got = [(layer, t) for _, layer, sid, t in rec.captures if sid == s.sample_id]
        if sorted(layer for layer, _ in got) != list(range(num_layers)):
            problems.append(f"sample {s.sample_id}: captured layers {[layer for layer, _ in got]}, expected "
                            f"{list(range(num_layers))} once each")
            continue
        ref = env.independent.layer_inputs(state, s.input_ids)
        noise = _dtype_noise(env, state, s.input_ids, ref)
        for layer, t in got:
            if tuple(t.shape) != tuple(ref[layer].shape):
                problems.append(f"sample {s.sample_id} ({s.num_tokens} tokens) layer {layer}: captured shape "
                                f"{tuple(t.shape)}, expected {tuple(ref[layer].shape)}")
                break
            err = (t - ref[layer]).abs().max().item()
            bound = max(env.tolerance * (1.0 + ref[layer].abs().max().item()), noise[layer])
            if err > bound:
                problems.append(f"sample {s.sample_id} layer {layer}: differs from transformers+PEFT by {err:.3g} "
                                f"(allowed {bound:.3g})")
                break
    return problems


@check("intercept_schedule")
def check_intercept_schedule__finetune_rows_read_no_prefix_cache(env: ConformanceEnv) -> None:
    """Fine-tuning samples that share a long prefix with client prompts and with each other (every Alpaca sample
    starts with the same template) are computed whole: no prefix-cache read for fine-tuning rows."""
    import random

    rng = random.Random(33)
    template = tuple(rng.randrange(3, env.vocab_size) for _ in range(PREFIX_SPAN))
    clients = [ClientRequest(f"prefix-client-{i}", template + tuple(rng.randrange(3, env.vocab_size)
                                                                    for _ in range(4 + i)), 3) for i in range(3)]
    env.run(clients)  # warms any prefix cache with the template, on the base model
    waves = [_prefix_samples(env, template, 2, 1200, 1), _prefix_samples(env, template, 3, 1300, 2)]
    injected: list[int] = []

    def inject(batch: ProposedBatch):  # noqa: ANN202
        # once per step id: a host that asks twice for one step is once_per_step's failure, not this check's
        if batch.has_prefill and len(injected) < len(waves) and batch.step_id not in injected:
            injected.append(batch.step_id)
            return waves[len(injected) - 1]
        return ()

    rec = Recorder(inject=inject)
    env.install(rec)
    env.run(clients[:1])
    env.run([ClientRequest("prefix-client-again", clients[1].prompt_ids, 3)])
    if len(injected) < len(waves):
        raise _fail(env, "intercept_schedule", "expected two prefill steps to inject into")
    samples = [s for wave in waves for s in wave]
    for step_id, wave in zip(injected, waves):
        record = rec.record_for(step_id)
        want = {s.sample_id: s.num_tokens for s in wave}
        got = dict(zip(record.finetune_sample_ids, record.finetune_lengths)) if record else None
        if got != want:
            raise _fail(env, "intercept_schedule", f"step {step_id}: expected fine-tuning rows (id: tokens) {want}, "
                        f"all computed in that step; the record says {got} (a row served from the prefix cache is "
                        "reported shorter, or not at all)")
    problems = _capture_problems(env, rec, samples, env.finetune_state)
    if problems:
        raise _fail(env, "intercept_schedule", f"fine-tuning samples sharing a {PREFIX_SPAN}-token prefix with client prompts "
                    "must be computed whole, without prefix-cache reads; " + "; ".join(problems[:3]))


@check("set_finetune_adapter")
def check_set_finetune_adapter__later_rows_use_the_new_weights(env: ConformanceEnv) -> None:
    """A second set_finetune_adapter with other weights is what the next steps' fine-tuning rows run with."""
    original = env.finetune_state
    for version, scale in ((original.version + 1, -2.0), (original.version + 2, 3.0)):
        state = original.with_tensors({k: v * scale for k, v in original.tensors.items()}, version=version)
        env.host.set_finetune_adapter(handed_copy(state))  # type: ignore[attr-defined]
        samples = make_samples(env, 2, lengths=[9, 21], seed=70 + version, first_id=1400 + 10 * version)
        rec = Recorder(inject=_inject_into_first_prefill(samples))
        try:
            env.install(rec)
            env.run(make_prompts(env, 2, seed=70 + version))
        finally:
            env.install(None)
        problems = _capture_problems(env, rec, samples, state)
        if problems:
            env.host.set_finetune_adapter(handed_copy(original))  # type: ignore[attr-defined]
            raise _fail(env, "set_finetune_adapter", f"after set_finetune_adapter(version {version}, weights x{scale}) "
                        "expected the next fine-tuning rows to run with exactly those weights; "
                        + "; ".join(problems[:3]))
    env.host.set_finetune_adapter(handed_copy(original))  # type: ignore[attr-defined]


@check("set_finetune_adapter")
def check_set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling(env: ConformanceEnv) -> None:
    """A state of another rank or ``lora_alpha`` than the one installed before it (a second fine-tuning job on the
    running engine, or a job restarted with other LoRA settings) runs the next fine-tuning rows at its own
    ``lora_alpha / r``: rank 16 with alpha 16, rank 8 with alpha 32 (same rank, other alpha) and rank 4 with alpha 6,
    each after the suite's rank-8 alpha-16 state. Blind batch 2026-12-07c, h07: the reserved slot kept the scaling of
    the first state it was loaded with and later states replaced only A and B."""
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    original = env.finetune_state
    for k, (r, alpha) in enumerate(((16, 16.0), (8, 32.0), (4, 6.0))):
        folder = build_lora_adapter(env.model_dir, env.model_dir.parent / f"finetune-adapter-r{r}-a{alpha:g}",
                                    seed=30 + k, r=r, lora_alpha=alpha)
        state = LoraAdapterState.load_pretrained(folder, name=original.name, version=original.version + 60 + k)
        env.host.set_finetune_adapter(handed_copy(state))  # type: ignore[attr-defined]
        samples = make_samples(env, 2, lengths=[8, 14], seed=179 + k, first_id=17900 + 10 * k)
        problems = _captures_then_restore(env, state, samples, seed=179 + k)
        if problems:
            raise _fail(env, "set_finetune_adapter", f"after a rank-{original.config.r} state with lora_alpha "
                        f"{original.config.lora_alpha:g}, set_finetune_adapter(rank {r}, lora_alpha {alpha:g}) must "
                        f"run the next fine-tuning rows at its scaling {alpha / r:g}; the rows differ from "
                        "transformers+PEFT with that state: " + "; ".join(problems[:3]))


def _greedy_problems(env: ConformanceEnv, outputs, requests, weights) -> list[str]:  # noqa: ANN001
    """Outputs that are not transformers+PEFT's greedy tokens; ``weights(request)`` names the adapter's weights."""
    by_id = {o.request_id: o for o in outputs}
    problems = []
    for r in requests:
        out = by_id.get(r.request_id)
        if out is None:
            problems.append(f"{r.request_id}: no output")
            continue
        if len(out.token_ids) != r.max_tokens:
            problems.append(f"{r.request_id}: {len(out.token_ids)} tokens, expected max_tokens={r.max_tokens}")
            continue
        miss = env.independent.greedy_mismatch(weights(r), r.prompt_ids, out.token_ids)
        if miss is not None:
            problems.append(f"{r.request_id} (adapter {r.adapter!r}, {len(r.prompt_ids)}-token prompt): "
                            + miss.describe())
    return problems


@check("intercept_schedule")
def check_intercept_schedule__client_outputs_match_independent_model(env: ConformanceEnv) -> None:
    """Greedy client outputs, base model and client adapter, with fine-tuning rows in their steps, are what plain
    transformers + PEFT generate (not merely what the host generates without fine-tuning rows)."""
    rec = Recorder(inject=_inject_every_step(env, 1500, 2))
    env.install(rec)
    requests = make_prompts(env, 6, seed=15, max_tokens=6)
    outputs = env.run(requests)
    problems = _greedy_problems(env, outputs, requests,
                                lambda r: env.client_adapter_dir if r.adapter == env.client_adapter else None)
    if problems:
        raise _fail(env, "intercept_schedule", "expected greedy outputs equal to transformers+PEFT's; "
                    + "; ".join(problems[:3]))


@check("graph_mode")
def check_graph_mode__pure_function_of_shape(env: ConformanceEnv) -> None:
    """graph_mode() answers from the batch's shape only: the same for the same shape under other ids and times,
    whatever the host ran before; the same when the shape runs again (a graph captured lazily the first time a shape
    runs changes the answer after it); and, for the first offer of every shape any earlier check made, the mode it
    proposed then is still graph_mode's answer now."""
    import dataclasses

    # The same workload three times (other tokens, same lengths): every shape of the first run recurs, from its first
    # run on this host (fresh lengths) to runs after it was run before.
    seen: dict[tuple, list[tuple[int, int, ExecutionMode]]] = {}
    for run in range(3):
        again_rec = Recorder()
        env.install(again_rec)
        env.run(make_prompts(env, 6, seed=17, max_tokens=7, prefix=f"shape-again-{run}", token_salt=run))
        for b in again_rec.batches:
            if b.scheduled:
                seen.setdefault(batch_shape(b), []).append((run, b.step_id, b.mode))
    changed = {shape: runs for shape, runs in seen.items() if len({m for _, _, m in runs}) > 1}
    if changed:
        shape, runs = next(iter(changed.items()))
        raise _fail(env, "graph_mode", f"one workload run 3 times proposed the same batch shape (prefill tokens, "
                    f"context) per row {shape} in other modes: " + ", ".join(f"run {r} step {s}: {m.value}"
                                                                           for r, s, m in runs)
                    + f"; expected one mode per shape ({len(changed)} shape(s) differ)")
    rec = Recorder()
    env.install(rec)
    env.run(make_prompts(env, 5, seed=18, max_tokens=5))
    batches = [b for b in rec.batches if b.scheduled]
    answers = [env.host.graph_mode(b) for b in batches]  # type: ignore[attr-defined]
    env.run(make_prompts(env, 3, seed=19, max_tokens=3))  # other steps in between
    drifted = [(b, env.host.graph_mode(b)) for b in env.ledger.first.values()]  # type: ignore[attr-defined]
    drifted = [(b, now) for b, now in drifted if now is not b.mode]
    if drifted:
        b, now = drifted[0]
        raise _fail(env, "graph_mode", f"step {b.step_id} (shape {batch_shape(b)}) was proposed in "
                    f"{b.mode.value} when it was offered, earlier in this run; graph_mode() now says {now.value} for "
                    f"that very batch ({len(drifted)} of the {len(env.ledger.first)} first offers per shape differ); "
                    "expected a pure function of the shape")
    for b, first in zip(batches, answers):
        twin = dataclasses.replace(
            b, step_id=b.step_id + 10_000, now=b.now + 123.0,
            scheduled=tuple(dataclasses.replace(r, request_id=f"twin-{r.request_id}", arrival_time=r.arrival_time + 1)
                            for r in b.scheduled))
        again, of_twin = env.host.graph_mode(b), env.host.graph_mode(twin)  # type: ignore[attr-defined]
        if not first is again is of_twin:
            raise _fail(env, "graph_mode", f"expected one answer for one shape ({_composition(b)}); graph_mode said "
                        f"{first.value}, later {again.value}, and {of_twin.value} for the same shape under other ids")


@check("run_profile_step")
def check_run_profile_step__synthetic_rows_never_reach_a_client(env: ConformanceEnv) -> None:
    """After profile steps, clients get outputs for their own requests only, and no synthetic row runs again."""
    rec = Recorder()
    env.install(rec)
    for shape in (ProfileShape(prefill_lengths=(12, 20), num_decode=2, decode_context=18),
                  ProfileShape(prefill_lengths=(33,), finetune_lengths=(17,))):
        env.host.run_profile_step(shape)  # type: ignore[attr-defined]
    leftover = env.host.has_unfinished()  # type: ignore[attr-defined]
    requests = make_prompts(env, 3, seed=20, prefix="after-profile")
    outputs = env.run_stepwise(requests)
    got = sorted(o.request_id for o in outputs)
    want = sorted(r.request_id for r in requests)
    if leftover or got != want:
        raise _fail(env, "run_profile_step", f"expected outputs for exactly {want} after two profile steps; got "
                    f"{got}" + (" (the host still had unfinished work right after the profile steps)" if leftover
                                else ""))
    real = rec.real_records()
    proposed = {b.step_id for b in rec.batches}
    stray = [r.step_id for r in real if r.step_id not in proposed]
    if stray:
        raise _fail(env, "run_profile_step", f"steps {stray} ran without being offered to on_schedule after the "
                    "profile steps: synthetic rows left in the engine keep running")


@check("lends_base_weights")
def check_lends_base_weights__views_of_the_checkpoint(env: ConformanceEnv) -> None:
    """base_weights(), when offered, names every checkpoint parameter, holds its values in the activation dtype on
    the host's device, shares storage across calls (views, not copies) and stays unchanged while serving."""
    lend = getattr(env.host, "base_weights", None)
    if lend is None:
        return  # optional capability (validate_host does not require it)
    weights = lend()
    if weights is None:
        return
    from transformers import AutoModelForCausalLM

    caps = env.host.capabilities()  # type: ignore[attr-defined]
    ref = dict(AutoModelForCausalLM.from_pretrained(env.model_dir, dtype=torch.float32).named_parameters())
    tied = {"lm_head.weight"} if torch.equal(ref.get("lm_head.weight", torch.empty(0)),
                                             ref["model.embed_tokens.weight"]) else set()
    missing = sorted(set(ref) - set(weights) - tied)
    if missing:
        raise _fail(env, "base_weights", f"expected every transformers parameter name; missing {missing[:4]}")
    again = lend()
    for name, t in weights.items():
        if name not in ref:
            raise _fail(env, "base_weights", f"{name!r} is not a transformers parameter name of the checkpoint")
        if str(t.dtype).removeprefix("torch.") != caps.activation_dtype or t.device.type != torch.device(caps.device).type:
            raise _fail(env, "base_weights", f"{name}: expected {caps.activation_dtype} on {caps.device}, got "
                        f"{t.dtype} on {t.device}")
        if again is not None and name in again and again[name].data_ptr() != t.data_ptr():
            raise _fail(env, "base_weights", f"{name}: two calls returned tensors at different addresses; expected "
                        "views of the engine's weights, never a copy")
        if not torch.allclose(t.float().cpu(), ref[name].detach(), atol=env.tolerance, rtol=env.tolerance):
            raise _fail(env, "base_weights", f"{name}: values differ from the checkpoint's")
    snapshot = {k: v.detach().clone() for k, v in weights.items()}
    env.run(make_prompts(env, 2, seed=21))
    changed = [k for k, v in weights.items() if not torch.equal(v, snapshot[k])]
    if changed:
        raise _fail(env, "base_weights", f"lent weights {changed[:3]} changed while serving; expected them unchanged "
                    "until shutdown")


@check("publish_adapter")
def check_publish_adapter__new_version_never_served_stale_kv(env: ConformanceEnv) -> None:
    """A second version published after requests ran on the first serves its own weights to the same prompts (a
    name reused with its prefix cache kept would serve KV computed with the older weights)."""
    from deltaserve_core.adapter_state import LoraAdapterState

    base = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-stale")
    prompts = make_prompts(env, 3, seed=22, max_tokens=4, adapter_every=0, prefix="stale")
    prompts = [ClientRequest(r.request_id, tuple((r.prompt_ids * PREFIX_SPAN)[:PREFIX_SPAN]), 4) for r in prompts]
    states = []
    for version, scale in ((101, 1.0), (102, -3.0)):
        state = base.with_tensors({k: v * scale for k, v in base.tensors.items()}, version=version)
        name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
        states.append(state)
        requests = [ClientRequest(f"{r.request_id}-v{version}", r.prompt_ids, r.max_tokens, adapter=name)
                    for r in prompts]
        problems = _greedy_problems(env, env.run(requests), requests, lambda r: state)
        if problems:
            raise _fail(env, "publish_adapter", f"version {version} published as {name!r}: expected transformers+PEFT's "
                        "greedy outputs for its weights; " + "; ".join(problems[:3]))




# ------------------------------------------------------------------------------------------ hook lifecycle


def _budget_filling_prompts(env: ConformanceEnv, seed: int) -> tuple[list[ClientRequest], int]:
    """Three client prompts that fill all but a sliver of the step's token budget (each within the tiny model's
    context), and a sample length two samples of which overflow what is left while staying within the host's
    fine-tuning cap."""
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    budget = env.config.max_batch_tokens if env.config is not None else 2048
    sliver = 48
    prompts = make_prompts(env, 3, seed=seed, max_tokens=2)
    share = (budget - sliver) // 3
    rng = torch.Generator().manual_seed(seed)
    prompts = [ClientRequest(p.request_id + "-big", tuple(torch.randint(3, env.vocab_size, (share,),
                                                                        generator=rng).tolist()), 2)
               for p in prompts]
    return prompts, max(sliver, min(caps.max_finetune_tokens_per_step // 2, 4 * sliver))


@check("intercept_schedule")
def check_intercept_schedule__rows_over_the_step_budget_run_or_are_refused_in_that_step(env: ConformanceEnv) -> None:
    """Fine-tuning rows that do not fit what the step's client rows left of the token budget, or that come on top of
    a step whose client rows take every running-request slot (an engine that counts each row as a sequence), either
    join that step or are refused in its record; a host never carries them over to a later step, nor drops them."""
    budget = env.config.max_batch_tokens if env.config is not None else 2048
    prompts, each = _budget_filling_prompts(env, 91)
    samples = make_samples(env, 2, lengths=[each, each], seed=91, first_id=2100)
    over_budget = f"{2 * each} tokens, over what the step's client rows left of max_batch_tokens={budget}"
    _rows_placed_in_their_step(env, prompts, samples, over_budget)
    cap = env.config.max_running_requests if env.config is not None else 32
    crowd = make_prompts(env, cap + 2, seed=92, max_tokens=2, adapter_every=0, prefix="slots")
    samples = make_samples(env, 3, lengths=[6, 9, 5], seed=92, first_id=2200)
    _rows_placed_in_their_step(env, crowd, samples, f"injected beside {cap + 2} client requests, more than "
                               f"max_running_requests={cap}", full=cap)


def _rows_placed_in_their_step(env: ConformanceEnv, prompts: list[ClientRequest], samples, why: str,  # noqa: ANN001
                               full: int = 0) -> None:
    """Serve ``prompts`` with ``samples`` injected into the first prefill step (with ``full``: the first one that
    schedules ``full`` client rows) and require the records to place every sample in that step, run or refused."""
    def inject(batch: ProposedBatch):  # noqa: ANN202
        if not rec.injected and batch.has_prefill and len(batch.scheduled) >= full:
            return samples
        return ()

    rec = Recorder(inject=inject)
    env.install(rec)
    env.run(prompts)
    if not rec.injected:
        raise _fail(env, "intercept_schedule", "no step with prefill" + (f" and {full} scheduled client rows" if full
                                                                            else "") + " was offered to on_schedule")
    (step_id, injected), = rec.injected.items()
    want = sorted(s.sample_id for s in injected)
    placed = {r.step_id: sorted(set(r.finetune_sample_ids) | set(r.aborted_sample_ids)) for r in rec.real_records()
              if set(r.finetune_sample_ids) & set(want) or set(r.aborted_sample_ids) & set(want)}
    if placed != {step_id: want}:
        raise _fail(env, "intercept_schedule", f"samples {want} ({why}) were returned for step {step_id}; the records "
                    f"place them as {placed}: run them in that step or refuse them there (aborted_sample_ids), never "
                    "later, never dropped")


@check("intercept_schedule")
def check_intercept_schedule__none_removes_every_hook(env: ConformanceEnv) -> None:
    """``intercept_schedule(None)``, ``capture_activation(None)`` and ``report_step_time(None)`` remove what was
    installed: nothing is called on it afterwards."""
    samples = make_samples(env, 1, lengths=[8], seed=92, first_id=2200)
    rec = Recorder(inject=_inject_into_first_prefill(samples))
    env.install(rec)
    env.run(make_prompts(env, 2, seed=92))
    if not rec.injected or not rec.records:
        raise _fail(env, "intercept_schedule", "the installed recorder saw no step to compare against")
    env.install(None)
    seen_events, seen_arrivals = len(rec.events), len(rec.arrivals)
    env.run(make_prompts(env, 3, seed=93))
    env.host.run_idle_step()  # type: ignore[attr-defined]
    late = [kind for kind, _ in rec.events[seen_events:]] + ["arrival"] * (len(rec.arrivals) - seen_arrivals)
    if late:
        raise _fail(env, "intercept_schedule", f"after removing every hook with None the old recorder still got "
                    f"{len(late)} calls ({', '.join(sorted(set(late)))}): None must uninstall")


@check("capture_activation")
def check_capture_activation__none_alone_removes_the_sink(env: ConformanceEnv) -> None:
    """``capture_activation(None)`` removes the sink even while an interceptor keeps adding fine-tuning rows: the
    rows of later steps never reach the removed sink (no begin_step, layer_input, should_abort or end_step). Removing
    all three hooks together cannot show this, since no row is added then."""
    first = make_samples(env, 1, lengths=[8], seed=149, first_id=4900)
    fired: list[int] = []
    rec = Recorder(inject=_inject_into_first_idle(first, fired))
    env.install(rec)
    env.host.run_idle_step()  # type: ignore[attr-defined]
    if not rec.begun:
        raise _fail(env, "capture_activation", "a fine-tuning-only step with the sink installed fed it nothing "
                    "(no begin_step), so its removal cannot be judged")
    env.host.capture_activation(None)  # type: ignore[attr-defined]
    seen = len(rec.events)
    later = make_samples(env, 1, lengths=[7], seed=150, first_id=4910)
    again: list[int] = []
    rec.inject = _inject_into_first_idle(later, again)
    env.host.run_idle_step()  # type: ignore[attr-defined]
    fed = sorted({kind for kind, _ in rec.events[seen:] if kind in ("begin", "layer", "poll", "end")})
    if fed:
        raise _fail(env, "capture_activation", f"after capture_activation(None), a step with a fine-tuning row (the "
                    f"interceptor still installed) called the removed sink: {', '.join(fed)}; None must uninstall it")


@check("capture_activation")
def check_capture_activation__a_second_install_replaces_the_first(env: ConformanceEnv) -> None:
    """Installing a new interceptor, sink or step sink replaces the previous one: only the newest is called."""
    old = Recorder()
    env.install(old)
    samples = make_samples(env, 1, lengths=[9], seed=94, first_id=2300)
    new = Recorder(inject=_inject_into_first_prefill(samples))
    env.install(new)
    env.run(make_prompts(env, 2, seed=94))
    problems = []
    if old.events or old.arrivals:
        problems.append(f"the replaced recorder still got {len(old.events) + len(old.arrivals)} calls "
                        f"({', '.join(sorted({k for k, _ in old.events})) or 'on_arrival'})")
    if not new.injected:
        problems.append("the new interceptor was never offered a prefill step")
    elif not any(sid == samples[0].sample_id for _, _, sid, _ in new.captures):
        problems.append("the new activation sink got no capture of the sample its interceptor injected")
    if not new.records:
        problems.append("the new step sink got no record")
    if problems:
        raise _fail(env, "capture_activation", "after a second install of all three hooks: " + "; ".join(problems))


@check("capture_activation")
def check_capture_activation__mixed_step_rows_complete_whatever_should_abort_says(env: ConformanceEnv) -> None:
    """Abort concerns fine-tuning-only steps: rows that share a step with client rows are computed and reported
    as completed even while ``should_abort`` would answer True."""
    samples = make_samples(env, 2, lengths=[7, 11], seed=95, first_id=2400)
    rec = Recorder(inject=_inject_into_first_prefill(samples), abort_after_layer=0)
    env.install(rec)
    outputs = env.run(make_prompts(env, 3, seed=95))
    if not rec.injected:
        raise _fail(env, "capture_activation", "no step with prefill was offered to on_schedule")
    (step_id, injected), = rec.injected.items()
    want = sorted(s.sample_id for s in injected)
    record = rec.record_for(step_id)
    polls = sum(1 for s, _ in rec.abort_polls if s == step_id)
    if record is None or sorted(record.finetune_sample_ids) != want or record.aborted_sample_ids:
        raise _fail(env, "capture_activation", f"step {step_id} carried client rows and samples {want}; with "
                    f"should_abort answering True ({polls} polls in that step) its record is {record}: only a "
                    "fine-tuning-only step may be aborted")
    if len(outputs) != 3:
        raise _fail(env, "capture_activation", f"{len(outputs)} of 3 client requests finished")


def _state_with_every_projection(env: ConformanceEnv) -> LoraAdapterState:
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    folder = build_lora_adapter(env.model_dir, env.model_dir.parent / "finetune-adapter-all-projections", seed=5, r=8,
                                target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"))
    return LoraAdapterState.load_pretrained(folder, name=env.finetune_state.name, version=env.finetune_state.version)


def _captures_then_restore(env: ConformanceEnv, state: LoraAdapterState, samples, seed: int) -> list[str]:  # noqa: ANN001
    """Inject ``samples`` into the first prefill step of two client prompts, put the suite's own fine-tuning adapter
    back, and say how the captures differ from transformers + PEFT under ``state`` (what the host was handed)."""
    rec = Recorder(inject=_inject_into_first_prefill(samples))
    try:
        env.install(rec)
        env.run(make_prompts(env, 2, seed=seed))
    finally:
        env.install(None)
        env.host.set_finetune_adapter(handed_copy(env.finetune_state))  # type: ignore[attr-defined]
    return _capture_problems(env, rec, samples, state)


@check("set_finetune_adapter")
def check_set_finetune_adapter__every_target_module_applies_or_is_refused(env: ConformanceEnv) -> None:
    """An adapter that targets the MLP projections as well as attention is applied whole, or refused when set;
    a host never silently drops some of its modules."""
    state = _state_with_every_projection(env)
    try:
        env.host.set_finetune_adapter(handed_copy(state))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - refusing is allowed; the message is the host's to word
        env.host.set_finetune_adapter(handed_copy(env.finetune_state))  # type: ignore[attr-defined]
        return
    samples = make_samples(env, 2, lengths=[8, 13], seed=96, first_id=2500)
    problems = _captures_then_restore(env, state, samples, seed=96)
    if problems:
        raise _fail(env, "set_finetune_adapter", "an adapter on q/k/v/o and gate/up/down_proj was accepted but its "
                    "rows differ from transformers+PEFT with all of it: " + "; ".join(problems[:3]))


@check("set_finetune_adapter")
def check_set_finetune_adapter__keeps_its_own_copy(env: ConformanceEnv) -> None:
    """The state handed to set_finetune_adapter is the caller's again once the call returns: changing its tensors
    afterwards (the core trains on) does not change what later fine-tuning rows run with."""
    state = env.finetune_state
    handed = handed_copy(state)
    env.host.set_finetune_adapter(handed)  # type: ignore[attr-defined]
    with torch.no_grad():
        for t in handed.tensors.values():
            t.mul_(-3.0)
    samples = make_samples(env, 2, lengths=[6, 10], seed=97, first_id=2600)  # shortest first, as fixed checks do
    problems = _captures_then_restore(env, state, samples, seed=97)
    if problems:
        raise _fail(env, "set_finetune_adapter", "the caller scaled the tensors it had handed over after the call "
                    "returned, and the next fine-tuning rows changed with them: copy what you keep; "
                    + "; ".join(problems[:3]))


# ------------------------------------------------------------------------------------------ rules the second blind
# batch (2026-12-02b) broke without a check noticing (issue #15)


@check("capture_activation", requires=_needs_abort)
def check_capture_activation__layer_input_arrives_before_its_layer_runs(env: ConformanceEnv) -> None:
    """Each layer's inputs reach the sink before that layer runs, not collected and flushed after the forward: in a
    fine-tuning-only step every input of layer L precedes the should_abort poll at the boundary after layer L."""
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    if num_layers < 2:
        return  # one layer has no later boundary to order its inputs against
    samples = make_samples(env, 2, lengths=[9, 14], seed=98, first_id=2700)
    fired: list[int] = []
    # The polls are the only layer boundaries a sink can see: the recorder never aborts, it counts them.
    rec = Recorder(inject=_inject_into_first_idle(samples, fired))
    order: list[tuple[str, int]] = []
    poll, layer_input = rec.should_abort, rec.layer_input

    def counted_poll(step_id: int) -> bool:
        order.append(("poll", -1))
        return poll(step_id)

    def ordered_input(step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        order.append(("layer", layer))
        layer_input(step_id, layer, sample_id, hidden)

    rec.should_abort, rec.layer_input = counted_poll, ordered_input  # type: ignore[method-assign]
    env.install(rec)
    env.host.run_idle_step()  # type: ignore[attr-defined]
    if not fired:
        raise _fail(env, "capture_activation", "run_idle_step() offered no empty batch: no fine-tuning-only step")
    if sum(1 for kind, _ in order if kind == "poll") < 2:
        return  # no boundaries to order against: the abort checks fail a host that does not poll every layer
    polls = 0
    for kind, layer in order:
        if kind == "poll":
            polls += 1
        elif polls > layer + 1:
            calls = ", ".join("poll" if k == "poll" else f"layer {n}" for k, n in order)
            raise _fail(env, "capture_activation", f"an input of layer {layer} arrived after {polls} should_abort "
                        f"polls, i.e. after the boundary that ends layer {layer} (calls in step {fired[0]}: {calls}); "
                        "expected each layer's inputs delivered before that layer runs, so the sink can stream them "
                        "(inputs cloned and flushed after the forward break that)")


@check("run_profile_step")
def check_run_profile_step__duration_in_seconds_within_the_call(env: ConformanceEnv) -> None:
    """A profile step's record, returned and delivered to the step sink, times the step in seconds of
    time.monotonic(): it starts within the run_profile_step call and lasts no longer than the call took."""
    rec = Recorder()
    env.install(rec)
    shape = ProfileShape(prefill_lengths=(24,), num_decode=2, decode_context=16, finetune_lengths=(10,))
    start = time.monotonic()
    got = env.host.run_profile_step(shape)  # type: ignore[attr-defined]
    end = time.monotonic()
    slack = 2e-3
    delivered = [r for r in rec.records if r.synthetic][-1:]  # delivery itself is profile_step_reports_its_shape's
    for where, r in (("returned", got), *(("delivered to the step sink", r) for r in delivered)):
        if not 0 < r.duration_s <= (end - start) + slack:
            raise _fail(env, "run_profile_step", f"the {where} record says duration_s={r.duration_s:.6g} for a "
                        f"call that took {end - start:.6f} s; expected seconds, positive and within the call "
                        "(a device event's elapsed_time() is milliseconds)")
        if not start - slack <= r.start_time <= r.start_time + r.duration_s <= end + slack:
            raise _fail(env, "run_profile_step", f"the {where} record claims [{r.start_time - start:.6f}, "
                        f"{r.start_time + r.duration_s - start:.6f}] s relative to the call, which took "
                        f"{end - start:.6f} s; expected time.monotonic() seconds within it")


#: A job's adapter name as users spell them: capitals, digits, ``_``, ``.`` and ``-`` (every other name the suite
#: publishes is lower-case and hyphenated, so a host that folds or sanitises names passes those).
_JOB_NAME = "Alpaca_Job.v2-7B"


@check("publish_adapter")
def check_publish_adapter__returned_name_serves_as_returned(env: ConformanceEnv) -> None:
    """A client can request the name publish_adapter returns exactly as returned, whatever the job's adapter name
    holds (capitals, digits, ``_``, ``.``, ``-``), and it serves what the same weights serve under a plain name."""
    spelled = LoraAdapterState.load_pretrained(env.client_adapter_dir, name=_JOB_NAME, version=7)
    plain = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-plain-name", version=7)
    name = env.host.publish_adapter(handed_copy(spelled))  # type: ignore[attr-defined]
    plain_name = env.host.publish_adapter(handed_copy(plain))  # type: ignore[attr-defined]
    prompts = make_prompts(env, 2, seed=23, max_tokens=4, adapter_every=0, prefix="job-name")
    served = {}
    for adapter in (plain_name, name):
        requests = [ClientRequest(f"{r.request_id}-{len(served)}", r.prompt_ids, r.max_tokens, adapter=adapter)
                    for r in prompts]
        try:
            served[adapter] = [o.token_ids for o in env.run(requests)]
        except ValueError as exc:
            raise _fail(env, "publish_adapter", f"a job named {_JOB_NAME!r} was published as {name!r}, but a client "
                        f"request on that name was refused: {exc}; expected the returned name servable as "
                        "returned (the core hands it to clients verbatim)") from exc
    if served[name] != served[plain_name]:
        raise _fail(env, "publish_adapter", f"the same weights served {served[name]} under {name!r} (job "
                    f"{_JOB_NAME!r}) but {served[plain_name]} under {plain_name!r}; expected the returned name to "
                    "serve the published weights whatever the job's name")


class ThreadCall(dict):
    """What :func:`_call_from_a_thread_during_the_first_layer_input` saw, filled in as it happens: ``step`` and
    ``layer`` (where the step was held), ``returned`` (within the wait), ``waited`` (seconds), ``result`` or
    ``error``, and ``arrivals`` (the request ids ``on_arrival`` had seen by the end of the wait)."""

    thread: threading.Thread | None = None


def _call_from_a_thread_during_the_first_layer_input(rec: Recorder, call: Callable[[], Any], wait_s: float,
                                                     name: str) -> ThreadCall:
    """Once, inside the first layer input ``rec`` records (a step is running), run ``call`` in a daemon thread (a
    server's request thread or idle loop) and hold the step up to ``wait_s`` for it to return. The caller joins
    ``.thread`` after the step (a call that waited for the step goes on then)."""
    seen = ThreadCall()
    record = rec.layer_input

    def run() -> None:
        try:
            seen["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - reported as the caller's failure
            seen["error"] = exc

    def holding_input(step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        record(step_id, layer, sample_id, hidden)
        if seen.thread is not None:
            return
        seen.thread = threading.Thread(target=run, name=name, daemon=True)
        start = time.monotonic()
        seen.thread.start()
        seen.thread.join(timeout=wait_s)
        seen.update(step=step_id, layer=layer, waited=time.monotonic() - start, returned=not seen.thread.is_alive(),
                    arrivals=[rid for rid, _ in rec.arrivals])

    rec.layer_input = holding_input  # type: ignore[method-assign]
    return seen


@check("intercept_schedule")
def check_intercept_schedule__request_submitted_during_a_step_is_served(env: ConformanceEnv) -> None:
    """A client request submitted from another thread while a step executes (a server's request thread) joins a
    later step and is served: never lost."""
    rec = Recorder(inject=_inject_into_first_prefill(make_samples(env, 1, lengths=[8], seed=99, first_id=2800)))
    early = make_prompts(env, 2, seed=99, max_tokens=3, adapter_every=0, prefix="before-mid-step")
    late = ClientRequest("submitted-mid-step", make_prompts(env, 1, seed=100)[0].prompt_ids, 3)
    # Waiting (bounded) makes the submit land inside the forward. A submit that waits for the step to end (a lock
    # around the engine) is driver__submit_from_another_thread_returns_while_a_step_runs's failure; here the wait
    # gives up, the request arrives after the step, and this check judges only that it is served.
    seen = _call_from_a_thread_during_the_first_layer_input(rec, lambda: env.host.submit(late), 2.0,  # type: ignore[attr-defined]
                                                            "conformance-request-thread")
    env.install(rec)
    outputs = []
    for r in early:
        env.host.submit(r)  # type: ignore[attr-defined]
    for _ in range(1000):
        outputs.extend(env.host.step())  # type: ignore[attr-defined]
        if seen.thread is not None:
            seen.thread.join(timeout=30.0)
        if not env.host.has_unfinished():  # type: ignore[attr-defined]
            break
    if seen.thread is None:
        raise _fail(env, "intercept_schedule", "no layer input was delivered for the injected sample, so no request "
                    "could be submitted while a step executed")
    if "error" in seen:
        err = seen["error"]
        raise _fail(env, "intercept_schedule", f"submit() from another thread while step {seen.get('step', '?')} "
                    f"executed raised {type(err).__name__}: {err}; expected the request accepted")
    got = sorted(o.request_id for o in outputs)
    if late.request_id not in got:
        when = (f"while step {seen['step']} executed" if seen.get("returned")
                else "during a step (it returned after the step)")
        told = any(rid == late.request_id for rid, _ in rec.arrivals)
        raise _fail(env, "intercept_schedule", f"request {late.request_id!r} was submitted from another thread "
                    f"{when} (on_arrival {'was' if told else 'was not'} called for it) and never produced an output; "
                    f"outputs: {got}, host unfinished: {env.host.has_unfinished()}; expected it to join a later "
                    "step, never lost")  # type: ignore[attr-defined]


@check("set_finetune_adapter")
def check_set_finetune_adapter__over_max_lora_rank_applies_or_is_refused(env: ConformanceEnv) -> None:
    """An adapter of a rank above the host's max_lora_rank is refused by raising, or (a host that can take it
    anyway) applied whole: never logged and dropped while the previous weights keep running."""
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    limit = env.config.max_lora_rank if env.config is not None else 16
    folder = build_lora_adapter(env.model_dir, env.model_dir.parent / f"finetune-adapter-r{2 * limit}", seed=6,
                                r=2 * limit)
    original = env.finetune_state
    state = LoraAdapterState.load_pretrained(folder, name=original.name, version=original.version + 50)
    try:
        env.host.set_finetune_adapter(handed_copy(state))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - refusing is what the contract asks; the message is the host's to word
        env.host.set_finetune_adapter(handed_copy(original))  # type: ignore[attr-defined]
        return
    samples = make_samples(env, 2, lengths=[7, 12], seed=101, first_id=2900)
    problems = _captures_then_restore(env, state, samples, seed=101)
    if problems:
        raise _fail(env, "set_finetune_adapter", f"an adapter of rank {2 * limit} (max_lora_rank={limit}) was "
                    "accepted without an exception, but the next fine-tuning rows do not run with it: expected it "
                    "refused by raising, or applied whole; " + "; ".join(problems[:3]))


#: How long the scripted core takes over its admission decision in the timing check: large next to a tiny-model step
#: (milliseconds), so a duration that contains it is plainly wrong even on a loaded 2-core box.
_SLOW_DECISION_S = 0.3


@check("report_step_time")
def check_report_step_time__duration_excludes_scheduling(env: ConformanceEnv) -> None:
    """A step's record times its forward only: it starts after on_schedule returned (the batch cannot run before its
    composition is decided), so it contains neither the scheduler's nor the core's time (a core that takes 0.3 s to
    decide makes a clock started with the scheduler plain). Calibration fits durations as forward cost: a clock
    started when the scheduler is entered prices admission as model time. (Whether the duration fits the wall clock
    is consistent_with_wall_clock's.)"""
    returned: dict[int, float] = {}

    def slow(batch: ProposedBatch):  # noqa: ANN202
        if len(returned) < 2 and not batch.is_empty:
            time.sleep(_SLOW_DECISION_S)
            returned[batch.step_id] = time.monotonic()  # just before on_schedule returns
        return ()

    rec = Recorder(inject=slow)
    env.install(rec)
    env.run(make_prompts(env, 1, seed=40, max_tokens=3))
    slack = 2e-3
    for r in rec.real_records():
        decided = returned.get(r.step_id)
        if decided is None:
            continue
        if r.start_time < decided - slack:
            raise _fail(env, "report_step_time", f"step {r.step_id} starts {decided - r.start_time:.4f} s before its "
                        f"on_schedule returned (the core took {_SLOW_DECISION_S} s to decide): expected the forward's "
                        "own start, after the batch was decided")
    if not any(r.step_id in returned for r in rec.real_records()):
        raise _fail(env, "report_step_time", f"no record for the steps {sorted(returned)} offered to on_schedule")


@check("capture_activation")
def check_capture_activation__step_id_is_the_scheduler_step(env: ConformanceEnv) -> None:
    """begin_step, layer_input, should_abort and end_step name the step by the id on_schedule was offered
    (ProposedBatch.step_id), the id its StepRecord carries: the core matches captures to admissions and records by
    it. Profile steps and declined idle proposals in between must not shift it (a worker numbering its own forwards
    does)."""
    env.host.run_profile_step(ProfileShape(prefill_lengths=(9,)))  # type: ignore[attr-defined]
    fired: list[int] = []
    samples = make_samples(env, 1, first_id=3100, lengths=[9])
    idle = make_samples(env, 1, first_id=3200, lengths=[7], seed=131)
    first_prefill = _inject_into_first_prefill(samples)
    first_idle = _inject_into_first_idle(idle, fired)

    def inject(batch: ProposedBatch):  # noqa: ANN202
        return first_idle(batch) if batch.is_empty else first_prefill(batch)

    rec = Recorder(inject=lambda batch: ())
    env.install(rec)
    env.host.run_idle_step()  # type: ignore[attr-defined]  # declined: the core has nothing to admit
    rec.inject = inject
    env.host.run_idle_step()  # type: ignore[attr-defined]  # a fine-tuning-only step right after the declined one
    env.run(make_prompts(env, 2, seed=41, max_tokens=2))
    # Which step carried which rows is the scheduler's to say (its records); whether rows ran in the step they were
    # injected into is injected_rows_run_in_same_step's. Here: the sink names each such step by that same id.
    begun: dict[int, set[int]] = {}
    for step, ids in rec.begun:
        begun.setdefault(step, set()).update(ids)
    captured = {(step, sample) for step, _, sample, _ in rec.captures}
    ended = {step for step, _, _ in rec.ended}
    ft_records = [r for r in rec.real_records() if r.finetune_sample_ids or r.aborted_sample_ids]
    if not ft_records:
        raise _fail(env, "capture_activation", f"no record carried the fine-tuning rows injected into steps "
                    f"{sorted(rec.injected)}")
    for r in ft_records:
        rows = set(r.finetune_sample_ids) | set(r.aborted_sample_ids)
        missing = sorted(i for i in rows if (r.step_id, i) not in captured)
        if begun.get(r.step_id) != rows or missing or r.step_id not in ended:
            raise _fail(env, "capture_activation", f"step {r.step_id} (the id on_schedule was offered and its record "
                        f"carries) ran fine-tuning rows {sorted(rows)}, but begin_step named that step with "
                        f"{sorted(begun.get(r.step_id, ()))}, layer inputs of {missing} came under other ids, end_step "
                        f"{'came' if r.step_id in ended else 'never came'} for it (sink step ids: "
                        f"{sorted(begun)}): expected the scheduler's step id in every sink call")


def _profile_records(rec: Recorder, got) -> list:  # noqa: ANN001
    return [r for r in rec.records if r.step_id == got.step_id]


@check("run_profile_step")
def check_run_profile_step__record_delivered_exactly_once(env: ConformanceEnv) -> None:
    """A profile step's record reaches the step sink exactly once, like every step's (synthetic steps a host runs
    around it, e.g. warm-up prefills of its decode rows, have records of their own under other step ids). Delivered
    twice, calibration counts one measurement as two samples and the timeline holds one step id twice."""
    rec = Recorder()
    env.install(rec)
    shapes = (ProfileShape(prefill_lengths=(10,), num_decode=2, decode_context=12),
              ProfileShape(prefill_lengths=(14, 6), finetune_lengths=(8,)))
    returned = [env.host.run_profile_step(shape) for shape in shapes]  # type: ignore[attr-defined]
    env.run(make_prompts(env, 1, seed=42, max_tokens=2))  # a record queued for the next step shows up there
    for shape, got in zip(shapes, returned):
        same = _profile_records(rec, got)
        if len(same) != 1:
            raise _fail(env, "report_step_time", f"the profile step {got.step_id} (shape {shape.prefill_lengths}, "
                        f"{shape.num_decode} decodes, FT {shape.finetune_lengths}) reached the step sink {len(same)} "
                        "times; expected exactly once")


@check("run_profile_step")
def check_run_profile_step__reports_the_mode_it_ran_in(env: ConformanceEnv) -> None:
    """A profile step asked for a mode the host cannot run (GRAPH on an eager-only host) falls back and reports the
    mode it ran in, one of capabilities().graph_modes, in the record returned and the one delivered. Echoing the
    requested mode makes calibration fit one mode's coefficients from the other's timings."""
    modes = env.host.capabilities().graph_modes  # type: ignore[attr-defined]
    rec = Recorder()
    env.install(rec)
    for mode in (ExecutionMode.GRAPH, ExecutionMode.EAGER):
        for shape in (ProfileShape(num_decode=3, decode_context=10, mode=mode),
                      ProfileShape(prefill_lengths=(8,), num_decode=2, decode_context=16, mode=mode)):
            got = env.host.run_profile_step(shape)  # type: ignore[attr-defined]
            delivered = {r.mode for r in _profile_records(rec, got)}
            if got.mode not in modes or not delivered <= {got.mode}:
                raise _fail(env, "run_profile_step", f"a profile step asked for {mode.value} ({shape.num_decode} "
                            f"decodes, prefills {shape.prefill_lengths}) reports mode {got.mode.value} (delivered: "
                            f"{sorted(m.value for m in delivered)}) on a host whose graph_modes are "
                            f"{sorted(m.value for m in modes)}: expected the mode the step ran in")
            if mode not in modes and got.mode == mode:
                raise _fail(env, "run_profile_step", f"asked {mode.value}, which this host cannot run, and got it back")


def _step_until_decoding(env: ConformanceEnv, rec: Recorder, request_id: str, limit: int = 50) -> None:
    """``step()`` until a batch offered to ``rec`` schedules ``request_id`` as a decode (its prompt done)."""
    for _ in range(limit):
        env.host.step()  # type: ignore[attr-defined]
        if any(r.request_id == request_id and r.prefill_tokens == 0 for b in rec.batches for r in b.scheduled):
            return
    raise _fail(env, "intercept_schedule", f"request {request_id!r} never decoded in {limit} steps")


@check("intercept_schedule")
def check_intercept_schedule__batch_lists_every_unfinished_request(env: ConformanceEnv) -> None:
    """Every request that arrived and has not finished is in the offered batch, scheduled or waiting: in particular
    a decoding request that a prefill step defers (hosts without mixed batches) is in ``waiting``, because its TPOT
    clock keeps running while that step executes and the core prices admission against it. So are requests queued
    behind full running-request slots, and the head of the queue that the step's token budget blocked."""
    rec = Recorder()
    env.install(rec)
    # The first request outlives a deferred prefill: engines defer one behind decodes for a while (S-LoRA: 10 steps),
    # and a request that has finished by then need not be listed.
    first, second = make_prompts(env, 2, seed=43, max_tokens=32, adapter_every=0)
    env.host.submit(first)  # type: ignore[attr-defined]
    _step_until_decoding(env, rec, first.request_id)
    seen = len(rec.batches)
    env.host.submit(second)  # type: ignore[attr-defined]  # arrives while the first decodes (8 tokens to go)
    env.run_stepwise([])
    prefills = [i for i in range(seen, len(rec.batches))
                if any(r.request_id == second.request_id and r.prefill_tokens > 0 for r in rec.batches[i].scheduled)]
    if not prefills:
        raise _fail(env, "intercept_schedule", f"no batch offered to on_schedule scheduled {second.request_id!r}'s prefill")
    # first is unfinished at an offer if a later offer still lists it (a decode in scheduled, or deferred in waiting)
    last_offer = max((i for i, b in enumerate(rec.batches)
                      if any(r.request_id == first.request_id for r in b.scheduled + b.waiting)), default=-1)
    overlapping = [rec.batches[i] for i in prefills if i < last_offer]
    if not overlapping:
        raise _fail(env, "intercept_schedule", f"{second.request_id!r}'s prefill was offered only after "
                    f"{first.request_id!r} (32 tokens) had finished: this check needs the prefill while the first "
                    "request decodes, and a prefill deferred behind 30 decode steps starves arrivals")
    for b in overlapping:
        listed = {r.request_id for r in b.scheduled} | {r.request_id for r in b.waiting}
        if first.request_id not in listed:
            raise _fail(env, "intercept_schedule", f"step {b.step_id} prefills {second.request_id!r} while "
                        f"{first.request_id!r} is still decoding, yet {first.request_id!r} is neither scheduled nor "
                        f"waiting (waiting: {sorted(r.request_id for r in b.waiting)}); expected a deferred decode "
                        "in ProposedBatch.waiting")
    # More client requests than running-request slots: the ones queued behind full slots are still arrived and
    # unfinished (their TTFT clocks run), so every offer lists them too.
    cap = env.config.max_running_requests if env.config is not None else 32
    crowd = make_prompts(env, cap + 4, seed=44, max_tokens=3, adapter_every=0, prefix="over-cap")
    rec = Recorder()
    env.install(rec)
    env.run_stepwise(crowd)
    problems = unlisted_requests(rec, {r.request_id for r in crowd})
    if problems:
        raise _fail(env, "intercept_schedule", f"{len(crowd)} requests submitted at once to a host with "
                    f"max_running_requests={cap}: every offer must list each arrived, unfinished request in scheduled "
                    "or waiting; " + "; ".join(problems[:3]))
    # Prompts that together exceed the step's token budget, submitted at once: each step prefills what fits, and the
    # head of the queue that the budget blocked still waits (its TTFT clock runs), so every offer lists it in waiting.
    # Enough of them that the budget blocks one in three steps in a row (the first offer after their arrival is not
    # judged, see unlisted_requests). Blind batch 2026-12-07, h11: a scheduler that pops the blocked head to test it
    # and puts it back after the batch's waiting list was taken.
    budget = env.config.max_batch_tokens if env.config is not None else 2048
    length = max(8, min(budget * 3 // 10, _context_length(env) - 8))
    count = min(-(-3 * budget // length) + 1, cap + 4)
    over_budget = make_prompts(env, count, seed=45, max_tokens=2, adapter_every=0, prefix="over-budget",
                               length_range=(length, length))
    rec = Recorder()
    env.install(rec)
    env.run_stepwise(over_budget)
    problems = unlisted_requests(rec, {r.request_id for r in over_budget})
    if problems:
        raise _fail(env, "intercept_schedule", f"{count} prompts of {length} tokens submitted at once to a host with "
                    f"max_batch_tokens={budget} (more than one step's budget): every offer must list each arrived, "
                    "unfinished request in scheduled or waiting, also the one the budget blocked; "
                    + "; ".join(problems[:3]))


def _context_length(env: ConformanceEnv) -> int:
    """The checkpoint's ``max_position_embeddings`` (a prompt plus its tokens must fit in it)."""
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(env.model_dir), "max_position_embeddings", 1 << 30))


def unlisted_requests(rec: Recorder, ids: set[str]) -> list[str]:
    """Offers that leave out a request of ``ids`` the host had been told of and had not finished.

    The proof of "not finished" is the host's own: a later offer lists the request again. "Arrived" means on_arrival
    came before the offer *before* this one, so a host that hands arrivals to its scheduler a step late (a request
    queue between threads or processes) is not blamed for that step."""
    listed = [{r.request_id for r in b.scheduled + b.waiting} & ids for b in rec.batches]
    last_listed: dict[str, int] = {}
    for i, names in enumerate(listed):
        for rid in names:
            last_listed[rid] = i
    problems = []
    for i, (b, names) in enumerate(zip(rec.batches, listed)):
        left_out = sorted(rid for rid, last in last_listed.items() if last > i and rid not in names
                          and rec.arrived_before_batch.get(rid, len(rec.batches)) < i)
        if left_out:
            problems.append(f"step {b.step_id} lists {len(b.scheduled)} scheduled and {len(b.waiting)} waiting but "
                            f"not {left_out[:4]}{' ...' if len(left_out) > 4 else ''} ({len(left_out)} arrived "
                            "requests a later step lists again)")
    return problems


def _token_times_and_steps(rec: Recorder, requests) -> tuple[dict[tuple[str, int], float], dict[str, list[int]]]:  # noqa: ANN001
    """What the offers show of ``requests``' tokens: (request, k) -> the time of its k-th token (its
    ``last_token_time`` when ``output_tokens`` was k), and request -> the steps whose row yields a token (decodes,
    last prefill chunks), in order, so token k came from the k-th of them. First offers only: offering a step
    twice is another check's."""
    prompt_len = {r.request_id: len(r.prompt_ids) for r in requests}
    producing: dict[str, list[int]] = {}
    token_time: dict[tuple[str, int], float] = {}
    first_offer = list({b.step_id: b for b in reversed(rec.batches)}.values())[::-1]
    for b in first_offer:
        for r in b.waiting + b.scheduled:
            if r.last_token_time is not None and r.output_tokens > 0:
                token_time.setdefault((r.request_id, r.output_tokens), r.last_token_time)
        for r in b.scheduled:
            if r.request_id in prompt_len and (r.prefill_tokens == 0
                                               or r.prefill_tokens + r.context_tokens >= prompt_len[r.request_id]):
                producing.setdefault(r.request_id, []).append(b.step_id)
    return token_time, producing


@check("report_step_time")
def check_report_step_time__record_after_the_step_outputs(env: ConformanceEnv) -> None:
    """A step's record reaches the step sink after the step's outputs were processed: the token a request got in
    step S (its time as the scheduler later shows it, ScheduledRequest.last_token_time) exists before S's record
    arrives. A record sent when the forward returns, ahead of sampling, shows the core request state one step old."""
    rec = Recorder()
    env.install(rec)
    requests = make_prompts(env, 3, seed=44, max_tokens=4)
    env.run(requests)
    token_time, producing = _token_times_and_steps(rec, requests)
    received = {}
    for r, at in zip(rec.records, rec.record_received_at):
        received.setdefault(r.step_id, at)
    compared = 0
    for (rid, k), t in sorted(token_time.items()):
        steps = producing.get(rid, [])
        if k > len(steps) or steps[k - 1] not in received:
            continue
        step = steps[k - 1]
        compared += 1
        if received[step] < t:
            raise _fail(env, "report_step_time", f"the record of step {step} reached the step sink "
                        f"{(t - received[step]) * 1e3:.3f} ms before the token {k} of {rid!r} that step produced: "
                        "expected the record after the step's outputs were processed")
    if not compared:
        raise _fail(env, "report_step_time", f"no token of {sorted(r.request_id for r in requests)} could be "
                    "matched to its step's record (batches offered to on_schedule show no output_tokens/last_token_time)")


@check("run_profile_step")
def check_run_profile_step__finetune_rows_never_dropped(env: ConformanceEnv) -> None:
    """A profile step runs its shape's fine-tuning rows, also when no fine-tuning adapter is loaded yet (build_env
    runs one such step before set_finetune_adapter), or refuses the shape by raising. A record that quietly leaves
    them out makes calibration price fine-tuning tokens at nothing. The rows that ran completed the whole forward, so
    the record (returned and delivered to the step sink) lists one ``finetune_sample_ids`` entry per
    ``finetune_lengths`` entry: a host that collects the ids from dataset sample ids and skips the calibration rows'
    placeholders reports lengths without ids (blind batch 2026-12-07b, h19)."""
    cases = []
    if env.profile_before_adapter is not None:
        shape, got = env.profile_before_adapter
        if not isinstance(got, Exception):
            cases.append(("before set_finetune_adapter", shape, got))
    rec = Recorder()
    env.install(rec)
    shape = ProfileShape(prefill_lengths=(8,), finetune_lengths=(6, 4))
    got = env.host.run_profile_step(shape)  # type: ignore[attr-defined]
    cases += [("with the fine-tuning adapter loaded", shape, r) for r in [got, *_profile_records(rec, got)]]
    for when, shape, got in cases:
        if sorted(got.finetune_lengths) != sorted(shape.finetune_lengths):  # type: ignore[attr-defined]
            raise _fail(env, "run_profile_step", f"a profile step {when} asked for fine-tuning rows "
                        f"{shape.finetune_lengths} and reports {got.finetune_lengths} (prefills "  # type: ignore[attr-defined]
                        f"{got.prefill_lengths}): expected them run, or the shape refused by raising")  # type: ignore[attr-defined]
        if len(got.finetune_sample_ids) != len(got.finetune_lengths):  # type: ignore[attr-defined]
            raise _fail(env, "run_profile_step", f"a profile step {when} ran fine-tuning rows of lengths "
                        f"{got.finetune_lengths} and its record lists finetune_sample_ids="  # type: ignore[attr-defined]
                        f"{got.finetune_sample_ids}: expected one id per completed row")  # type: ignore[attr-defined]


@check("intercept_schedule")
def check_intercept_schedule__no_on_arrival_for_refused_requests(env: ConformanceEnv) -> None:
    """A request ``submit`` refuses (the reserved adapter, an adapter the host never loaded) never entered the host:
    on_arrival is never called for it, or the core aborts fine-tuning steps for it and keeps waiting on a request
    that is never scheduled."""
    rec = Recorder()
    env.install(rec)
    refused: list[str] = []
    for i, adapter in enumerate((RESERVED_ADAPTER_NAME, "conformance-adapter-never-loaded")):
        request = ClientRequest(f"refused-{i}", (5, 6, 7, 8), 2, adapter=adapter)
        try:
            env.host.submit(request)  # type: ignore[attr-defined]
        except ValueError:  # ReservedAdapterError, or the unknown-adapter error every host raises
            refused.append(request.request_id)
    if env.host.has_unfinished():  # type: ignore[attr-defined]
        env.run_stepwise([])  # an accepted one is the reserved-adapter checks' concern, not this one's
    told = [rid for rid, _ in rec.arrivals if rid in refused]
    if told:
        raise _fail(env, "intercept_schedule", f"submit() refused {refused} (it raised), yet on_arrival was called for "
                    f"{told}; expected on_arrival only for requests the host accepted (validate, then announce)")


@check("driver")
def check_driver__generate_returns_outputs_in_request_order(env: ConformanceEnv) -> None:
    """HostDriver.generate returns one output per request in request order, also when the requests finish in
    another order (callers pair outputs with requests by position)."""
    import dataclasses

    base = make_prompts(env, 3, seed=31, adapter_every=0, prefix="order")
    # the first submitted finishes last, the last first
    requests = [dataclasses.replace(r, max_tokens=m) for r, m in zip(base, (5, 3, 1))]
    outputs = env.run(requests)
    got = [o.request_id for o in outputs]
    want = [r.request_id for r in requests]
    if got != want:
        raise _fail(env, "driver", f"generate() for {want} (max_tokens 5, 3, 1: they finish last to first) returned "
                    f"outputs for {got}; expected exactly one output per request, in request order")
    # A request submitted earlier (a server's traffic) that finishes while generate() runs is not generate()'s: it
    # returns one output per request it was given, never the earlier one's as well.
    earlier, *given = make_prompts(env, 3, seed=33, adapter_every=0, prefix="order-beside")
    earlier = dataclasses.replace(earlier, max_tokens=2)
    given = [dataclasses.replace(r, max_tokens=4) for r in given]
    env.host.submit(earlier)  # type: ignore[attr-defined]
    env.host.step()  # type: ignore[attr-defined]  # its prefill: it finishes during the generate() call below
    outputs = env.run(given)
    env.run_stepwise([])
    got = [o.request_id for o in outputs]
    want = [r.request_id for r in given]
    if got != want:
        raise _fail(env, "driver", f"generate() for {want}, called while {earlier.request_id!r} (submitted earlier with "
                    f"submit(), 1 token to go) was unfinished, returned outputs for {got}; expected exactly one output "
                    "per request it was given, in request order")
    # The same prompt twice in one call, on the base model and on the client adapter (an A/B of an adapter against
    # its base): each output is its own request's, paired by position, not by prompt (blind batch 2026-12-07c, h24).
    prompt = make_prompts(env, 1, seed=38, adapter_every=0, prefix="same-prompt")[0]
    twins = [dataclasses.replace(prompt, request_id="same-prompt-base", max_tokens=6),
             dataclasses.replace(prompt, request_id="same-prompt-adapter", max_tokens=6, adapter=env.client_adapter)]
    outputs = env.run(twins)
    got = [o.request_id for o in outputs]
    if got != [t.request_id for t in twins]:
        raise _fail(env, "driver", f"generate() for two requests with the same prompt (base, then client adapter) "
                    f"returned outputs for {got}; expected one per request, in request order")
    for t, o in zip(twins, outputs):
        wrong = env.independent.greedy_mismatch(env.client_adapter_dir if t.adapter else None, t.prompt_ids,
                                                o.token_ids)
        if wrong is not None:
            raise _fail(env, "driver", f"generate() for two requests with the same prompt, one on the base model and "
                        f"one on {env.client_adapter!r}: {t.request_id!r} {wrong.describe()}; expected each "
                        "request's own greedy tokens (outputs paired by position, never by prompt)")


def _scheduled_views(env: ConformanceEnv, seed: int, slos: tuple = (None,) * 3):  # noqa: ANN001, ANN202
    """Serve three client requests (prompts of different lengths, ``slos[i]`` on request i) and return the requests,
    their outputs, and every ScheduledRequest the host offered for them in offer order:
    ``{request_id: [(batch, view, in_scheduled, produced, known)]}``. ``produced`` counts the request's earlier steps
    that yielded a token (its last prefill chunk, each decode); ``known`` those of them whose StepRecord reached the
    step sink before this offer (records come after a step's outputs are processed, so their tokens are known to the
    scheduler; a host with a step in flight may not know the latest one yet)."""
    import dataclasses

    # one short, one past 16 tokens and one past 32 (scheduler-side windows of recent tokens are 16 or 32 long)
    requests = [dataclasses.replace(r, slo=slo, max_tokens=n) for r, slo, n in
                zip(make_prompts(env, 3, seed=seed, max_tokens=4, prefix="view"), slos, (4, 18, 40))]
    rec = Recorder()
    env.install(rec)
    outputs = {o.request_id: o for o in env.run(requests)}
    recorded: list[set[int]] = []  # per offer, in offer order: steps whose record arrived before it
    done: set[int] = set()
    for kind, step_id in rec.events:
        if kind == "record":
            done.add(step_id)
        elif kind == "schedule":
            recorded.append(set(done))
    prompt = {r.request_id: len(r.prompt_ids) for r in requests}
    views: dict[str, list] = {r.request_id: [] for r in requests}
    token_steps: dict[str, list[int]] = {r.request_id: [] for r in requests}
    for b, before in zip(rec.batches, recorded):
        for in_scheduled, group in ((True, b.scheduled), (False, b.waiting)):
            for v in group:
                if v.request_id in views:
                    earlier = [s for s in token_steps[v.request_id] if s != b.step_id]
                    views[v.request_id].append((b, v, in_scheduled, len(earlier),
                                                sum(1 for s in earlier if s in before)))
        for v in b.scheduled:
            if v.request_id in views and b.step_id not in token_steps[v.request_id] and (
                    v.is_decode or v.context_tokens + v.prefill_tokens >= prompt[v.request_id]):
                token_steps[v.request_id].append(b.step_id)
    return requests, outputs, views


@check("intercept_schedule")
def check_intercept_schedule__scheduled_request_token_times(env: ConformanceEnv) -> None:
    """ScheduledRequest.first_token_time is the time of the request's first token: set once it is known (a step of
    the request that yielded a token has been reported), never changed, no earlier than its arrival and no later than
    the driver saw that token; last_token_time is that of its latest token: never before first_token_time, never
    going back, never after the offer (``batch.now``), and None while the request has no token."""
    requests, outputs, views = _scheduled_views(env, seed=32)
    eps = 0.05  # clock reads of two threads/processes; the orderings checked are a decode step or more apart
    problems: list[str] = []
    for r in requests:
        out = outputs.get(r.request_id)
        first_seen = None
        last_seen = None
        for b, v, in_scheduled, _, known in views[r.request_id]:
            where = f"{r.request_id} in step {b.step_id} ({'scheduled' if in_scheduled else 'waiting'})"
            if known and (v.first_token_time is None or v.last_token_time is None):
                problems.append(f"{where}: {known} step(s) that yielded its tokens were reported already, but "
                                f"first_token_time={v.first_token_time}, last_token_time={v.last_token_time}")
                continue
            if v.first_token_time is None:
                # No token yet, so no most recent token: a last_token_time here (an engine's stats initialised at
                # arrival) would start the request's TPOT clock before its first token exists.
                if v.last_token_time is not None:
                    problems.append(f"{where}: last_token_time {v.last_token_time:.6f} although the request has no "
                                    "token yet (first_token_time None): both stay None until its first token")
                continue
            f, last = v.first_token_time, v.last_token_time
            if last is None or f > last + 1e-9:
                problems.append(f"{where}: first_token_time {f:.6f} is later than last_token_time {last}")
            if first_seen is not None and abs(f - first_seen) > 1e-9:
                problems.append(f"{where}: first_token_time changed from {first_seen:.6f} to {f:.6f}")
            first_seen = f if first_seen is None else first_seen
            if f < v.arrival_time - eps:
                problems.append(f"{where}: first_token_time {f:.6f} is before its arrival {v.arrival_time:.6f}")
            if out is not None and f > out.first_token_time + eps:
                problems.append(f"{where}: first_token_time {f:.6f} is after the driver saw the first token "
                                f"({out.first_token_time:.6f})")
            if last is not None:
                if last > b.now + eps:
                    problems.append(f"{where}: last_token_time {last:.6f} is after the offer (now={b.now:.6f})")
                if last_seen is not None and last < last_seen - 1e-9:
                    problems.append(f"{where}: last_token_time went back from {last_seen:.6f} to {last:.6f}")
                last_seen = last if last_seen is None else max(last_seen, last)
    if problems:
        raise _fail(env, "intercept_schedule", "ScheduledRequest token times do not follow the request's tokens "
                    "(first_token_time: its first token, set once; last_token_time: its latest, >= first): "
                    + "; ".join(problems[:4]))


@check("intercept_schedule")
def check_intercept_schedule__prefill_context_is_what_the_prompt_computed_before(env: ConformanceEnv) -> None:
    """ScheduledRequest.context_tokens of a prefill row is the KV the request already has before the step: in its
    first prefill step the prompt prefix the host found cached (0 without a prefix cache; the suite's prompts are
    random, yet a short vocabulary lets their first tokens match an earlier prompt's, as SGLang's radix cache showed),
    then that prefix plus the prompt tokens its earlier chunks computed, so that a served request's prefix and chunks
    add up to its prompt. Blind batch 2026-12-07c, h27: ``seq_len - 1`` for every row, right for decodes only, so every
    prefill was priced as attending over its own prompt."""
    requests, outputs, views = _scheduled_views(env, seed=37)
    problems: list[str] = []
    for r in requests:
        n = len(r.prompt_ids)
        computed: int | None = None  # KV before the next prefill chunk: None until the first one fixes the prefix
        for b, v, in_scheduled, _, _ in views[r.request_id]:
            if not in_scheduled or v.prefill_tokens == 0:
                continue
            if computed is None:
                if not 0 <= v.context_tokens < n:
                    problems.append(f"{r.request_id} ({n}-token prompt) in step {b.step_id}: first prefill of "
                                    f"{v.prefill_tokens} tokens with context_tokens={v.context_tokens}, expected a "
                                    f"cached prefix of 0..{n - 1} tokens (0 without a prefix cache)")
                computed = v.context_tokens
            elif v.context_tokens != computed:
                problems.append(f"{r.request_id} ({n}-token prompt) in step {b.step_id}: prefill of "
                                f"{v.prefill_tokens} tokens with context_tokens={v.context_tokens}, expected {computed} "
                                "(the cached prefix plus the prompt tokens its earlier steps computed)")
            computed += v.prefill_tokens
        out = outputs.get(r.request_id)
        if out is not None and out.token_ids and computed is not None and computed != n:
            problems.append(f"{r.request_id} ({n}-token prompt) was served, yet its first prefill's context_tokens "
                            f"plus its prefill chunks add up to {computed} tokens, not its prompt's {n}")
    if problems:
        raise _fail(env, "intercept_schedule", "ScheduledRequest.context_tokens is the KV-cache length before the "
                    "step: " + "; ".join(problems[:4]))


@check("intercept_schedule")
def check_intercept_schedule__scheduled_request_output_tokens_exclude_the_prompt(env: ConformanceEnv) -> None:
    """ScheduledRequest.output_tokens counts the tokens the request generated so far, never its prompt: 0 until the
    step of its last prefill chunk, then one more per step that decoded it (a host with a step in flight may not
    know that step's token yet: between the tokens of the request's reported steps and those of all its earlier
    steps)."""
    requests, _, views = _scheduled_views(env, seed=33)
    problems: list[str] = []
    for r in requests:
        for b, v, in_scheduled, produced, known in views[r.request_id]:
            if not known <= v.output_tokens <= produced:
                want = f"{produced}" if known == produced else f"between {known} and {produced}"
                problems.append(f"{r.request_id} ({len(r.prompt_ids)}-token prompt) in step {b.step_id} "
                                f"({'scheduled' if in_scheduled else 'waiting'}): output_tokens={v.output_tokens}, "
                                f"expected {want} (its earlier steps that yielded a token: {produced}, reported: "
                                f"{known})")
    if problems:
        raise _fail(env, "intercept_schedule", "ScheduledRequest.output_tokens must count generated tokens only: "
                    + "; ".join(problems[:4]))


@check("intercept_schedule")
def check_intercept_schedule__scheduled_request_carries_its_slo(env: ConformanceEnv) -> None:
    """Every ScheduledRequest of a client request carries the SLO that request was submitted with, exactly (all
    fields, or only some of them, or ``None`` for a request without one): the core budgets each request against
    its own objectives."""
    from deltaserve_core.types import RequestSLO

    slos = (RequestSLO(ttft_s=1.25, tpot_s=0.375, avg_tpot_s=0.25), None, RequestSLO(tpot_s=0.625))
    requests, _, views = _scheduled_views(env, seed=34, slos=slos)
    problems: list[str] = []
    for r in requests:
        if not views[r.request_id]:
            problems.append(f"{r.request_id}: never offered to on_schedule")
        for b, v, *_ in views[r.request_id]:
            if v.slo != r.slo:
                problems.append(f"{r.request_id} in step {b.step_id}: slo={v.slo}, submitted with {r.slo}")
                break
    if problems:
        raise _fail(env, "intercept_schedule", "expected each ScheduledRequest to carry its request's own SLO: "
                    + "; ".join(problems[:3]))


@check("intercept_schedule")
def check_intercept_schedule__client_ids_equal_to_sample_ids_are_served_intact(env: ConformanceEnv) -> None:
    """Client request ids and fine-tuning sample ids are separate namespaces: clients numbering their requests
    "0", "1", ... while samples 0, 1, ... run in the same steps get every token they asked for, exactly (retiring a
    fine-tuning row never finishes, aborts or edits the client request whose id spells its sample id)."""
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    plan = iter([(0, 1), (2,), (3,)])  # sample ids per eligible step
    seed = iter(range(3300, 3400))

    def inject(batch: ProposedBatch):  # noqa: ANN202
        if batch.is_empty or (not caps.mixed_batches and not batch.has_prefill):
            return ()
        ids = next(plan, ())
        samples = []
        for sid in ids:
            s = make_samples(env, 1, seed=next(seed), lengths=[9])[0]
            samples.append(type(s)(sid, s.input_ids, s.loss_mask))
        return samples

    rec = Recorder(inject=inject)
    env.install(rec)
    base = make_prompts(env, 4, seed=35, max_tokens=5, adapter_every=0)
    requests = [ClientRequest(str(i), r.prompt_ids, r.max_tokens) for i, r in enumerate(base)]
    outputs = env.run(requests)
    ran = sorted({s.sample_id for samples in rec.injected.values() for s in samples})
    problems = _greedy_problems(env, outputs, requests, lambda r: None)
    if problems:
        raise _fail(env, "intercept_schedule", f"client requests {[r.request_id for r in requests]} ran next to "
                    f"fine-tuning samples {ran}; expected every client output intact and equal to transformers' "
                    "greedy output: " + "; ".join(problems[:3]))


_PROBE_MARK = "DELTASERVE-DTYPE-PROBE "


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_probe(host, vocab_size: int) -> dict:  # noqa: ANN001
    """What ``host`` declares (activation dtype, model dtype) and what it delivers: the dtype of the layer inputs of
    one fine-tuning row, and of the base weights it lends (if it lends any)."""
    from deltaserve_core.hooks import LendsBaseWeights
    from deltaserve_core.types import FineTuneSample

    delivered: set[str] = set()
    rec = Recorder(inject=_inject_into_first_prefill([FineTuneSample(3900, (5, 9, 14, 7, 11, 6), (False,) * 3
                                                                     + (True,) * 3)]))
    keep = rec.layer_input

    def layer_input(step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        delivered.add(_dtype_name(hidden.dtype))
        keep(step_id, layer, sample_id, hidden)

    rec.layer_input = layer_input  # type: ignore[method-assign]
    for hook in (host.intercept_schedule, host.capture_activation, host.report_step_time):
        hook(rec)
    try:
        host.generate([ClientRequest("dtype-probe", tuple(3 + i % (vocab_size - 3) for i in range(7)), 2)])
    finally:
        for hook in (host.intercept_schedule, host.capture_activation, host.report_step_time):
            hook(None)
    lent: list[str] = []
    if isinstance(host, LendsBaseWeights):
        weights = host.base_weights()
        lent = sorted({_dtype_name(t.dtype) for t in (weights or {}).values()})
    return {"activation_dtype": host.capabilities().activation_dtype, "model_dtype": host.model_spec().dtype,
            "delivered": sorted(delivered), "lent": lent}


def second_host_command(env: ConformanceEnv, dtype: str, entry: str, model_shape: str = "test"
                        ) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of a child process that runs ``entry`` (``module:function``) against a second
    host of ``env``'s kind: the function reads, as JSON in ``sys.argv[1]``, the spec, device, options and checkpoint
    cache of ``env``'s host, ``dtype`` and ``model_shape``, and starts it with :func:`.plugin.build_env`. A second engine never runs in
    the suite's own process (engines hold process-wide state: CUDA contexts, compile caches, plugin registrations)."""
    import json
    import os
    import sys

    config = env.config
    args = {"spec": env.host_spec, "device": config.device if config else "cpu", "dtype": dtype,
            "options": dict(config.options) if config else {}, "cache": str(env.model_dir.parent),
            "shape": model_shape}
    module, _, func = entry.partition(":")
    argv = [sys.executable, "-c", f"from {module} import {func}; {func}()", json.dumps(args)]
    return argv, dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def second_host_from_argv() -> ConformanceEnv:
    """In the child of :func:`second_host_command`: start the host its JSON argument describes."""
    import json
    import sys
    from pathlib import Path

    from .plugin import build_env

    args = json.loads(sys.argv[1])
    return build_env(args["spec"], device=args["device"], dtype=args["dtype"], options=args["options"],
                     cache_dir=Path(args["cache"]), validate=False, model_shape=args.get("shape", "test"))


def _dtype_probe_child() -> None:
    """Child-process entry of ``capabilities__dtypes_follow_the_engine_dtype``: start the host in another dtype, probe
    it, print one marked JSON line (``stage`` says whether starting or probing failed)."""
    import json

    try:
        env = second_host_from_argv()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which skips with it
        print(_PROBE_MARK + json.dumps({"stage": "start", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    try:
        result = {"stage": "done", **_dtype_probe(env.host, env.vocab_size)}
    except Exception as exc:  # noqa: BLE001
        result = {"stage": "probe", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        env.host.shutdown()  # type: ignore[attr-defined]
    print(_PROBE_MARK + json.dumps(result), flush=True)


def _dtype_problems(found: dict, started: str) -> list[str]:
    problems = []
    for field_name, what in (("activation_dtype", "capabilities().activation_dtype"),
                             ("model_dtype", "model_spec().dtype")):
        for kind in ("delivered", "lent"):
            for actual in found[kind]:
                if found[field_name] != actual:
                    source = "layer inputs it delivered" if kind == "delivered" else "base weights it lent"
                    problems.append(f"started in {started}: {what} says {found[field_name]!r} but the {source} are "
                                    f"{actual}")
    if not found["delivered"]:
        problems.append(f"started in {started}: no layer input was delivered for the fine-tuning row")
    return problems


@check("capabilities", spawns=True)
def check_capabilities__dtypes_follow_the_engine_dtype(env: ConformanceEnv) -> None:
    """capabilities().activation_dtype and model_spec().dtype are the dtype the engine really runs: that of the
    layer inputs it delivers and of the base weights it lends (the core sizes its activation buffer and loads the
    backward's base from them). The suite's host runs float32, the fields' default, so a second host of the same
    kind is started in bfloat16 in a child process (no second engine in this process) and held to the same rule."""
    import json
    import subprocess

    problems = _dtype_problems(_dtype_probe(env.host, env.vocab_size), env.dtype)
    if problems:
        raise _fail(env, "capabilities", "expected the declared dtypes to be the engine's: " + "; ".join(problems))
    if env.dtype != "float32":
        return  # a declaration left at the float32 default already disagrees with this host's tensors
    import pytest

    if not env.host_spec:
        pytest.skip("capabilities__dtypes_follow_the_engine_dtype: the env does not say how its host was started "
                    "(ConformanceEnv.host_spec), so no bfloat16 host can be started to tell the declared dtype from "
                    "the float32 default")
    argv, child_env = second_host_command(env, "bfloat16", "deltaserve_conformance.checks:_dtype_probe_child")
    device = env.config.device if env.config else "cpu"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=child_env)
    except subprocess.TimeoutExpired as exc:
        raise _fail(env, "capabilities", "a bfloat16 host of the same kind did not start and serve one request "
                    "within 300 s") from exc
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(_PROBE_MARK)]
    if not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise _fail(env, "capabilities", f"the bfloat16 probe of {env.host_spec!r} exited {done.returncode} without "
                    f"a result: {' | '.join(tail)}")
    found = json.loads(lines[-1][len(_PROBE_MARK):])
    if found["stage"] == "start":
        pytest.skip(f"capabilities__dtypes_follow_the_engine_dtype: {env.host_spec} cannot run bfloat16 on "
                    f"{device} ({found['error'][:300]}); only its {env.dtype} declaration was checked")
    if found["stage"] == "probe":
        raise _fail(env, "capabilities", f"a bfloat16 host of the same kind started but failed to serve one request "
                    f"with a fine-tuning row: {found['error'][:500]}")
    problems = _dtype_problems(found, "bfloat16")
    if problems:
        raise _fail(env, "capabilities", "expected the declared dtypes to be the engine's: " + "; ".join(problems))


# More fixed checks (declared facts, step bookkeeping, interleavings), then the generated and stateful ones, which run last.
from . import checks_bookkeeping as _bookkeeping  # noqa: E402,F401
from . import checks_interleaving as _interleaving  # noqa: E402,F401
from . import checks_lifecycle as _lifecycle  # noqa: E402,F401
from . import checks_audit as _audit  # noqa: E402,F401
from . import checks_reach as _reach  # noqa: E402,F401
from . import checks_rows as _rows  # noqa: E402,F401
from . import checks_shapes as _shapes  # noqa: E402,F401
from . import scenarios as _scenarios  # noqa: E402,F401
