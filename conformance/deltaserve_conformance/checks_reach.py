"""Checks that reach where the fixed workloads did not (blind batch 2026-12-05's misses, docs/conformance.md): adapters
whose keys go beyond the attention projections, and a client request submitted from a second thread while a step runs.

The other reach of that review went into existing checks (more requests than running-request slots, ``generate``
next to ``submit``, outputs past 16 and 32 tokens, a batch shape run again) and into the generated and stateful
scenarios. They register into :data:`.checks.CHECKS` like the fixed checks there.
"""

from __future__ import annotations

import dataclasses

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientRequest
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

from .checks import (_call_from_a_thread_during_the_first_layer_input, _fail, _greedy_problems, _inject_into_first_idle,
                     _inject_into_first_prefill, check)
from .harness import ConformanceEnv, Recorder, handed_copy, make_prompts, make_samples

__all__: list[str] = []

#: target modules of the adapters published by ``publish_adapter__every_target_module_serves_or_is_refused``: the MLP
#: projections next to attention, and the same with the output head (``lm_head``), which many engines' LoRA kernels
#: do not cover
_BEYOND_ATTENTION = {
    "mlp": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "mlp-lm-head": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"),
}


def _adapter_on(env: ConformanceEnv, label: str, modules: tuple[str, ...], version: int) -> LoraAdapterState:
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    # a larger scale than the client adapter's: the output head's delta must move greedy tokens to be seen at all
    folder = build_lora_adapter(env.model_dir, env.model_dir.parent / f"published-adapter-{label}", seed=11, r=8,
                                target_modules=modules, scale=0.2)
    return LoraAdapterState.load_pretrained(folder, name=f"conformance-{label}", version=version)


@check("publish_adapter")
def check_publish_adapter__every_target_module_serves_or_is_refused(env: ConformanceEnv) -> None:
    """An adapter published with target modules beyond attention (the MLP projections; those and ``lm_head``) is
    served whole under the returned name, every module applied, or refused by raising: a host never serves it with
    the modules its LoRA kernels do not cover left out (an engine's loader that skips them with a warning)."""
    problems = []
    for version, (label, modules) in enumerate(_BEYOND_ATTENTION.items(), start=61):
        state = _adapter_on(env, label, modules, version)
        try:
            name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - refusing is allowed; the message is the host's to word
            continue
        requests = [dataclasses.replace(r, adapter=name)
                    for r in make_prompts(env, 3, seed=61 + version, max_tokens=6, adapter_every=0,
                                          prefix=f"beyond-attention-{label}")]
        outputs = env.run(requests)
        found = _greedy_problems(env, outputs, requests, lambda r, s=state: s)
        if found:
            problems.append(f"{label} ({', '.join(modules)}), published as {name!r}: " + "; ".join(found[:2]))
    if problems:
        raise _fail(env, "publish_adapter", "adapters beyond the attention projections were accepted by "
                    "publish_adapter() but are not served as transformers+PEFT serves all of their modules (expected "
                    "every module applied, or the publish refused by raising): " + " | ".join(problems))


@check("driver")
def check_driver__submit_from_another_thread_returns_while_a_step_runs(env: ConformanceEnv) -> None:
    """``submit`` from a second thread (a server's request thread) while a fine-tuning-only step runs returns while
    that step still runs, and on_arrival has told the core of the request by then: a submit that waits for the step
    to end (a lock held for the whole engine step) leaves the core no way to abort the step for the request. The
    step is held inside its first layer input until the submit returns or the bound passes; the bound is far above
    any plausible lock-free submit: max(5 s, 10 x the longest step this host just ran)."""
    warm = Recorder()
    env.install(warm)
    env.run(make_prompts(env, 2, seed=71, max_tokens=2, prefix="warm-before-thread"))
    env.install(None)
    longest = max((r.duration_s for r in warm.real_records()), default=0.0)
    bound = max(5.0, 10.0 * longest)

    fired: list[int] = []
    rec = Recorder(inject=_inject_into_first_idle(make_samples(env, 2, lengths=[7, 11], seed=72, first_id=7200),
                                                  fired))
    late = ClientRequest("submitted-from-a-second-thread", make_prompts(env, 1, seed=73)[0].prompt_ids, 2)
    seen = _call_from_a_thread_during_the_first_layer_input(rec, lambda: env.host.submit(late), bound,  # type: ignore[attr-defined]
                                                            "conformance-second-thread")
    env.install(rec)
    try:
        env.host.run_idle_step()  # type: ignore[attr-defined]
        if seen.thread is not None:
            seen.thread.join(timeout=60.0)  # a blocked submit goes on once the step ended
        env.run_stepwise([])
    finally:
        env.install(None)
    if not fired or seen.thread is None:
        raise _fail(env, "driver", "run_idle_step() with two fine-tuning samples injected delivered no layer input, so "
                    "no request could be submitted while a step ran")
    if "error" in seen:
        err = seen["error"]
        raise _fail(env, "driver", f"submit() from a second thread while step {seen.get('step')} ran raised "
                    f"{type(err).__name__}: {err}; expected the request accepted")
    if not seen["returned"]:
        raise _fail(env, "driver", f"submit() from a second thread while fine-tuning-only step {seen['step']} was held "
                    f"in its layer {seen['layer']} input had not returned after {seen['waited']:.1f} s (bound max(5 s, "
                    f"10 x the longest step, {longest:.3f} s)); expected it to return while the step runs, never "
                    "waiting for the step to end")
    if late.request_id not in seen["arrivals"]:
        raise _fail(env, "driver", f"submit() from a second thread returned while step {seen['step']} ran, but "
                    "on_arrival had not been called for the request by then; expected the core told of it during the "
                    "step (it aborts a fine-tuning-only step for it)")


@check("intercept_schedule")
def check_intercept_schedule__reserved_adapter_refused_by_generate(env: ConformanceEnv) -> None:
    """``generate`` refuses a request on the reserved fine-tuning adapter (or the training adapter's own name) as
    ``submit`` does, before anything runs: a batch path that checks only "is this adapter loaded?" would serve it on
    the live training weights once ``set_finetune_adapter`` loaded them."""
    st = env.finetune_state
    for name in (RESERVED_ADAPTER_NAME, st.name):
        request = ClientRequest(f"generate-reserved-{len(name)}", (5, 6, 7, 8), 2, adapter=name)
        try:
            outputs = env.host.generate([request])  # type: ignore[attr-defined]
        except ValueError:  # ReservedAdapterError, or the unknown-adapter error every host raises
            if env.host.has_unfinished():  # type: ignore[attr-defined]
                env.run_stepwise([])
                raise _fail(env, "intercept_schedule", f"generate() refused a request on {name!r} but queued it "
                            "anyway") from None
            continue
        raise _fail(env, "intercept_schedule", f"generate() served a request on adapter {name!r} (the reserved "
                    f"fine-tuning adapter {RESERVED_ADAPTER_NAME!r} or the training adapter {st.name!r}): "
                    f"{[list(o.token_ids) for o in outputs]}; expected it refused with ValueError as submit() does")


@check("publish_adapter")
def check_publish_adapter__serves_a_copy_of_the_state(env: ConformanceEnv) -> None:
    """The published name serves the weights ``state`` held when ``publish_adapter`` returned, whatever the caller
    does to those tensors afterwards (a training loop that reuses a snapshot's buffers): the host keeps its own copy,
    never an alias of the caller's tensors (``.to()`` to a device and dtype they already have returns them as is)."""
    published = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-own-copy", version=41)
    handed = handed_copy(published)
    name = env.host.publish_adapter(handed)  # type: ignore[attr-defined]
    for tensor in handed.tensors.values():
        tensor.mul_(-4.0)  # the caller reuses its buffers once the call returned
    requests = [dataclasses.replace(r, adapter=name)
                for r in make_prompts(env, 3, seed=81, max_tokens=5, adapter_every=0, prefix="own-copy")]
    problems = _greedy_problems(env, env.run(requests), requests, lambda r: published)
    if problems:
        raise _fail(env, "publish_adapter", f"{name!r} was published, then the caller scaled the tensors it had handed "
                    "in by -4: expected the published weights still served (the host's own copy); "
                    + "; ".join(problems[:3]))


@check("driver")
def check_driver__has_unfinished_from_another_thread_during_a_step(env: ConformanceEnv) -> None:
    """``has_unfinished()`` asked from another thread (a server's idle loop) while a step that admits a submitted
    request runs answers True: the request is being prefilled, not finished. An engine that moves requests from its
    waiting queue to its running set only after the step's outputs leaves them in neither while the forward runs."""
    request = make_prompts(env, 1, seed=91, max_tokens=3, adapter_every=0, prefix="unfinished-mid-step")[0]
    rec = Recorder(inject=_inject_into_first_prefill(make_samples(env, 1, lengths=[8], seed=91, first_id=9100)))
    # a host that makes the call wait for the step is not judged here (returned False after the wait)
    seen = _call_from_a_thread_during_the_first_layer_input(rec, lambda: env.host.has_unfinished(), 5.0,  # type: ignore[attr-defined]
                                                            "conformance-idle-loop")
    env.install(rec)
    try:
        env.host.submit(request)  # type: ignore[attr-defined]
        env.run_stepwise([])
    finally:
        env.install(None)
    if seen.get("returned") and "result" in seen and not seen["result"]:
        raise _fail(env, "driver", f"has_unfinished() asked from another thread while the step admitting "
                    f"{request.request_id!r} ran (inside its first fine-tuning layer input) answered False; expected "
                    "True until the request's output is returned")


@check("driver")
def check_driver__has_unfinished_counts_a_request_during_its_on_arrival(env: ConformanceEnv) -> None:
    """A request is unfinished from ``submit``: ``has_unfinished()`` asked inside ``on_arrival`` (the core reacts to an
    arrival by asking whether client work is pending, to abort or skip a fine-tuning-only step) answers True, for the
    first request on an empty engine, sent with ``submit()`` and with ``generate()``. A frontend that notifies
    arrival listeners before it hands the request to the engine's queue tells the core there is none (blind batch
    2026-12-07b, h26)."""
    rec = Recorder()
    seen: dict[str, object] = {}
    arrived = rec.on_arrival

    def asking(request_id: str, arrival_time: float) -> None:
        arrived(request_id, arrival_time)
        try:
            seen[request_id] = env.host.has_unfinished()  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - reported below
            seen[request_id] = exc

    rec.on_arrival = asking  # type: ignore[method-assign]
    env.install(rec)
    submitted, generated = make_prompts(env, 2, seed=92, max_tokens=2, prefix="unfinished-on-arrival")
    try:
        env.host.submit(submitted)  # type: ignore[attr-defined]
        env.run_stepwise([])
        env.run([generated])
    finally:
        env.install(None)
    # a request without on_arrival is on_arrival_once_per_client_request's to report
    problems = [f"{seen[rid]!r} for {rid!r} ({how})"
                for rid, how in ((submitted.request_id, "submit()"), (generated.request_id, "generate()"))
                if rid in seen and seen[rid] is not True]
    if problems:
        raise _fail(env, "driver", "has_unfinished() asked inside on_arrival of the only request on an empty engine "
                    f"answered {'; '.join(problems)}; expected True: a request is unfinished from submit")
