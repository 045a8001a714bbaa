"""Checks for the gaps the audit of 2026-12-05 found (docs/conformance.md, "Audit 2026-12-05"): rules whose checks a
plausible engine-shaped violation still passed. A set_finetune_adapter that lands while client requests decode,
two published versions of one adapter served side by side, the client-side bookkeeping of the driver (one engine
step per ``step()``, ``has_unfinished`` after fine-tuning and calibration rows, the times of a ``ClientOutput``).

They register into :data:`.checks.CHECKS` like the fixed checks there.
"""

from __future__ import annotations

import time

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientOutput, ClientRequest
from deltaserve_core.types import ProfileShape

from .checks import _fail, _greedy_problems, _inject_into_first_idle, check
from .checks_interleaving import _scaled
from .harness import ConformanceEnv, Recorder, handed_copy, make_prompts, make_samples

__all__: list[str] = []


# ------------------------------------------------------------------------------------------ interleavings


@check("set_finetune_adapter")
def check_set_finetune_adapter__requests_in_flight_keep_their_adapter(env: ConformanceEnv) -> None:
    """``set_finetune_adapter`` called while client requests decode (the core installs every optimizer step's weights
    between steps, whatever is in flight) changes the reserved adapter only: requests on the base model, on a client
    adapter and on a published version finish with their own weights. A host that rebuilds its adapter slot table on
    install (and keeps running requests' old slot indices), or reloads every adapter, moves them mid-request. One
    install names its state after the loaded client adapter (a job that goes on training the adapter clients are
    served, under its name) with other weights: the client adapter's requests, running and submitted after it, keep
    its folder's weights; a host whose LoRA table is keyed by the state's own name, the reserved name an alias of
    that entry, overwrites the client adapter (blind batch 2026-12-07b, h29)."""
    client = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-ftswap", version=71)
    own = _scaled(client, 1.6)
    published = env.host.publish_adapter(handed_copy(own))  # type: ignore[attr-defined]
    adapters = (None, env.client_adapter, published)
    requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=adapters[i % 3])
                for i, r in enumerate(make_prompts(env, 6, seed=71, max_tokens=10, adapter_every=0, prefix="ftswap"))]
    weights = {None: None, env.client_adapter: env.client_adapter_dir, published: own}
    late = ClientRequest("ftswap-client-late", requests[1].prompt_ids[1:], 4, adapter=env.client_adapter)
    original = env.finetune_state
    for r in requests:
        env.host.submit(r)  # type: ignore[attr-defined]
    outputs: list[ClientOutput] = []
    try:
        for _ in range(3):
            outputs.extend(env.host.step())  # type: ignore[attr-defined]
        # another name and version, weights no client adapter holds: what a moved request would get is visible
        env.host.set_finetune_adapter(handed_copy(_scaled(original, -4.0, name="0-ftswap", version=72)))  # type: ignore[attr-defined]
        outputs.extend(env.host.step())  # type: ignore[attr-defined]
        env.host.set_finetune_adapter(handed_copy(_scaled(original, -3.0, name=env.client_adapter, version=73)))  # type: ignore[attr-defined]
        outputs.extend(env.host.step())  # type: ignore[attr-defined]
        env.host.submit(late)  # type: ignore[attr-defined]
        env.host.set_finetune_adapter(handed_copy(_scaled(original, 3.0, version=74)))  # type: ignore[attr-defined]
        outputs.extend(env.run_stepwise([]))
    finally:
        env.host.set_finetune_adapter(handed_copy(original))  # type: ignore[attr-defined]
    problems = _greedy_problems(env, outputs, requests + [late], lambda r: weights[r.adapter])
    if problems:
        raise _fail(env, "set_finetune_adapter", "set_finetune_adapter was called after 3, 4 (a state named "
                    f"{env.client_adapter!r}, other weights) and 5 steps of requests on the base model, "
                    f"{env.client_adapter!r} and {published!r} (one more on {env.client_adapter!r} submitted after the "
                    "5th): expected each to finish with its own weights; " + "; ".join(problems[:3]))


@check("publish_adapter")
def check_publish_adapter__older_version_keeps_its_weights_after_a_newer_publish(env: ConformanceEnv) -> None:
    """Two versions of one job adapter are published (``<adapter>@v<N>``, then ``@v<N+1>``) and served in the same
    steps: each name serves its own weights. A host that keys adapter weights by the job's adapter name (one slot per
    adapter, its versions aliases of it) serves the newest weights under every older name."""
    client = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-versions", version=41)
    older, newer = client, _scaled(client, -2.5, version=42)
    names = [env.host.publish_adapter(handed_copy(s)) for s in (older, newer)]  # type: ignore[attr-defined]
    # one stable name for both is allowed (publishing it again replaces its weights): then only the newer is served
    states = dict(zip(names, (older, newer)))
    names = list(dict.fromkeys(names))
    requests = [ClientRequest(f"{r.request_id}-{i % 2}", r.prompt_ids, r.max_tokens, adapter=names[i % len(names)])
                for i, r in enumerate(make_prompts(env, 4, seed=42, max_tokens=5, adapter_every=0, prefix="versions"))]
    problems = _greedy_problems(env, env.run(requests), requests, lambda r: states[r.adapter])
    if problems:
        raise _fail(env, "publish_adapter", f"versions 41 and 42 (weights x -2.5) published as {names!r} and served "
                    "in the same steps: expected each name's own weights; " + "; ".join(problems[:3]))


# ------------------------------------------------------------------------------------------ the driver's bookkeeping


@check("driver")
def check_driver__step_runs_at_most_one_engine_step(env: ConformanceEnv) -> None:
    """Each ``step()`` call runs at most one engine step (one record reaches the step sink), also while nothing
    finishes in it: a ``step()`` that loops until some request finishes runs several steps per call."""
    rec = Recorder()
    env.install(rec)
    requests = [ClientRequest(r.request_id, r.prompt_ids, m, adapter=r.adapter)
                for r, m in zip(make_prompts(env, 3, seed=43, prefix="onestep"), (7, 5, 6))]
    for r in requests:
        env.host.submit(r)  # type: ignore[attr-defined]
    calls = []
    for _ in range(200):
        if not env.host.has_unfinished():  # type: ignore[attr-defined]
            break
        before = len(rec.records)
        finished = env.host.step()  # type: ignore[attr-defined]
        # distinct steps, not records: a record delivered twice is report_step_time's concern
        calls.append((len({r.step_id for r in rec.records[before:] if not r.synthetic}), len(finished)))
    over = [(i, n) for i, (n, _) in enumerate(calls) if n > 1]
    if over:
        i, n = over[0]
        raise _fail(env, "driver", f"step() call {i} ran {n} engine steps (records of {n} steps reached the step "
                    f"sink; steps per call: {[c[0] for c in calls]}); expected at most one per call")


@check("driver")
def check_driver__has_unfinished_counts_client_requests_only(env: ConformanceEnv) -> None:
    """``has_unfinished()`` is about client requests only: False after a calibration step with fine-tuning rows and
    after a fine-tuning-only step (rows an engine keeps as requests until it retires them do not count), True once a
    request is submitted, False again once every request was returned."""
    problems = []
    if env.host.has_unfinished():  # type: ignore[attr-defined]
        env.run_stepwise([])
        problems.append("True before this check submitted anything (a previous check's work was left over)")
    env.host.run_profile_step(ProfileShape(prefill_lengths=(6,), num_decode=0,  # type: ignore[attr-defined]
                                           finetune_lengths=(5, 7)))
    if env.host.has_unfinished():  # type: ignore[attr-defined]
        problems.append("True after run_profile_step() with fine-tuning rows, no client request submitted")
        env.run_stepwise([])
    fired: list[int] = []
    env.install(Recorder(inject=_inject_into_first_idle(make_samples(env, 2, seed=44, first_id=4400), fired)))
    env.host.run_idle_step()  # type: ignore[attr-defined]
    if fired and env.host.has_unfinished():  # type: ignore[attr-defined]
        problems.append(f"True after a fine-tuning-only step (step {fired[0]}), no client request submitted")
        env.run_stepwise([])
    env.install(None)
    request = make_prompts(env, 1, seed=44, max_tokens=3, prefix="unfinished")[0]
    env.host.submit(request)  # type: ignore[attr-defined]
    if not env.host.has_unfinished():  # type: ignore[attr-defined]
        problems.append(f"False right after submit({request.request_id!r}), before any step")
    got = []
    for _ in range(100):
        got.extend(o.request_id for o in env.host.step())  # type: ignore[attr-defined]
        if request.request_id in got:
            break
    if request.request_id in got and env.host.has_unfinished():  # type: ignore[attr-defined]
        problems.append(f"True after {request.request_id!r}, the only client request, was returned")
        env.run_stepwise([])
    if problems:
        raise _fail(env, "driver", "expected has_unfinished() True exactly while a submitted client request has not "
                    "been returned; " + "; ".join(problems))


@check("driver")
def check_driver__client_output_times_follow_the_request(env: ConformanceEnv) -> None:
    """A ``ClientOutput``'s ``arrival_time`` is when ``submit`` accepted the request (not when it was first
    scheduled: here the engine is stepped only 50 ms after both requests were submitted), ``first_token_time`` and
    ``finish_time`` come after it, and ``token_times``, when given, has one time per token, non-decreasing, from
    ``first_token_time`` to ``finish_time``."""
    first, second = make_prompts(env, 2, seed=45, max_tokens=5, prefix="times")
    windows = {}
    for r in (first, second):
        t0 = time.monotonic()
        env.host.submit(r)  # type: ignore[attr-defined]
        windows[r.request_id] = (t0, time.monotonic())
    time.sleep(0.05)
    outputs = {o.request_id: o for o in env.run_stepwise([])}
    problems = []
    for r in (first, second):
        out = outputs.get(r.request_id)
        if out is None:
            problems.append(f"{r.request_id}: no output")
            continue
        lo, hi = windows[r.request_id]
        if not lo - 1e-3 <= out.arrival_time <= hi + 1e-3:
            problems.append(f"{r.request_id}: arrival_time is {out.arrival_time - lo:+.4f} s from the start of its "
                            f"submit() call, which returned after {hi - lo:.4f} s")
        if not out.arrival_time <= out.first_token_time <= out.finish_time:
            problems.append(f"{r.request_id}: arrival {out.arrival_time:.4f}, first token {out.first_token_time:.4f}, "
                            f"finish {out.finish_time:.4f} are out of order")
        times = out.token_times
        if times:
            if len(times) != len(out.token_ids):
                problems.append(f"{r.request_id}: {len(times)} token_times for {len(out.token_ids)} tokens")
            elif list(times) != sorted(times) or times[0] != out.first_token_time or times[-1] != out.finish_time:
                problems.append(f"{r.request_id}: token_times {[round(t - times[0], 4) for t in times]} (from the "
                                f"first) are not non-decreasing from first_token_time to finish_time "
                                f"({out.first_token_time - times[0]:+.4f}, {out.finish_time - times[0]:+.4f})")
    if problems:
        raise _fail(env, "driver", "expected each ClientOutput's times to follow its request (arrival within submit, "
                    "one token time per token); " + "; ".join(problems))
