"""The host contract as plain functions, one rule each, named ``<hook>__<rule>``.

Each check takes a :class:`ConformanceEnv`, drives the host through its hooks and its client API, and raises
``AssertionError`` with a message that names the host, the hook, what was expected and what happened. Checks
are plain functions (so a fork can call one from a debugger or its own tests) and are collected by
``test_conformance.py`` for pytest. ``CHECKS`` lists them with the capability each needs, if any.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from deltaserve_core.driver import ClientRequest
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, HostProtocolError, ReservedAdapterError, validate_host
from deltaserve_core.types import ExecutionMode, HostCapabilities, ProfileShape, ProposedBatch

from .harness import ConformanceEnv, Recorder, make_prompts, make_samples

__all__ = ["Check", "CHECKS", "run_check"]


@dataclass(frozen=True)
class Check:
    name: str
    hook: str
    func: Callable[[ConformanceEnv], None]
    requires: Callable[[HostCapabilities], str | None] = lambda caps: None  # returns a skip reason or None

    def __call__(self, env: ConformanceEnv) -> None:
        self.func(env)


CHECKS: list[Check] = []


def check(hook: str, requires: Callable[[HostCapabilities], str | None] | None = None):  # noqa: ANN201
    def register(func: Callable[[ConformanceEnv], None]) -> Callable[[ConformanceEnv], None]:
        name = func.__name__.removeprefix("check_")
        CHECKS.append(Check(name, hook, func, requires or (lambda caps: None)))
        return func

    return register


def _fail(env: ConformanceEnv, hook: str, message: str) -> AssertionError:
    return AssertionError(f"host {env.host_name!r}, {hook}: {message}")


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


def run_check(env: ConformanceEnv, c: Check) -> None:
    """Run one check with clean hooks before and after (so one failing check cannot poison the next)."""
    env.install(None)
    try:
        c(env)
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
    """Called exactly once per executed step, before it, with the composition the host then ran."""
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
    counter = iter(range(1000, 10_000))

    def inject(batch: ProposedBatch):  # noqa: ANN202
        caps = env.host.capabilities()  # type: ignore[attr-defined]
        if not caps.mixed_batches and not batch.has_prefill:
            return ()
        return make_samples(env, 2, seed=next(counter), first_id=next(counter) * 10)

    rec = Recorder(inject=inject)
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
    counter = iter(range(5000, 50_000))

    def inject(batch: ProposedBatch):  # noqa: ANN202
        caps = env.host.capabilities()  # type: ignore[attr-defined]
        if not caps.mixed_batches and not batch.has_prefill:
            return ()
        return make_samples(env, 2, seed=next(counter), first_id=next(counter) * 10)

    rec = Recorder(inject=inject)
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
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cache = getattr(env, "_reference_model", None)
    if cache is None:
        base = AutoModelForCausalLM.from_pretrained(env.model_dir, dtype=torch.float32)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            env.finetune_state.save_pretrained(f"{tmp}/ft")
            cache = PeftModel.from_pretrained(base, f"{tmp}/ft").eval()
        env._reference_model = cache  # type: ignore[attr-defined]
    captured: list[torch.Tensor] = []
    layers = cache.get_base_model().model.layers
    handles = [layer.register_forward_pre_hook(lambda m, args, kw: captured.append(
        (args[0] if args else kw["hidden_states"])[0].detach().clone()), with_kwargs=True) for layer in layers]
    try:
        with torch.no_grad():
            cache(input_ids=torch.tensor([input_ids]))
    finally:
        for h in handles:
            h.remove()
    return captured


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
    """should_abort=True at a layer boundary stops a fine-tuning-only step there and hands the samples back."""
    samples = make_samples(env, 2, lengths=[10, 12], seed=9, first_id=90)
    fired = []

    def inject(batch: ProposedBatch):  # noqa: ANN202
        if batch.is_empty and not fired:
            fired.append(batch.step_id)
            return samples
        return ()

    rec = Recorder(inject=inject, abort_after_layer=1)
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
    shape = ProfileShape(prefill_lengths=(16, 8), num_decode=3, decode_context=20, finetune_lengths=(6,))
    got = env.host.run_profile_step(shape)  # type: ignore[attr-defined]
    if not got.synthetic:
        raise _fail(env, "report_step_time", "run_profile_step returned a record without synthetic=True")
    want = ((8, 16), 3, 60, (6,))
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
    counter = iter(range(7000, 70_000))

    def inject(batch: ProposedBatch):  # noqa: ANN202
        caps = env.host.capabilities()  # type: ignore[attr-defined]
        if not caps.mixed_batches and not batch.has_prefill:
            return ()
        return make_samples(env, 1, seed=next(counter), first_id=next(counter) * 10)

    rec = Recorder(inject=inject)
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
    """Weights published with publish_adapter are served under the returned name (same outputs as loading them)."""
    from deltaserve_core.adapter_state import LoraAdapterState

    state = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-published", version=1)
    name = env.host.publish_adapter(state)  # type: ignore[attr-defined]
    if not isinstance(name, str) or not name or name == RESERVED_ADAPTER_NAME:
        raise _fail(env, "publish_adapter", f"returned {name!r}; it must return a client-visible adapter name")
    requests = [r for r in make_prompts(env, 4, seed=14, adapter_every=1)]
    via_client = env.run(requests)
    published = env.run([ClientRequest(r.request_id + "-pub", r.prompt_ids, r.max_tokens, adapter=name) for r in requests])
    for a, b in zip(via_client, published):
        if a.token_ids != b.token_ids:
            raise _fail(env, "publish_adapter", f"adapter published as {name!r} generates {list(b.token_ids)}, the same "
                        f"weights loaded as a client adapter generate {list(a.token_ids)}")


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
