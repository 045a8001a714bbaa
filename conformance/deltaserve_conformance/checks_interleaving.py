"""Checks of operations that meet while client requests are in flight or after training moved on: a published
version against later training and a republish of its name, a publish landing while requests on another adapter
decode, ``run_idle_step`` called with client work pending, ``generate()`` called beside a ``submit()``ted request, and
the retraction of one published version among others, with requests still running on it.

Each was missing until a blind batch of broken hosts (2026-12-04; the last three 2026-12-06b) went through the suite
unseen; they register into :data:`.checks.CHECKS` like the fixed checks there.
"""

from __future__ import annotations

import time

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientOutput, ClientRequest

from .checks import (_call_from_a_thread_during_the_first_layer_input, _fail, _greedy_problems,
                     _inject_into_first_idle, _needs_abort, _step_until_decoding, check)
from .harness import PREFIX_SPAN, ConformanceEnv, Recorder, handed_copy, make_prompts, make_samples

__all__: list[str] = []


def _scaled(state: LoraAdapterState, scale: float, *, name: str | None = None,
            version: int | None = None) -> LoraAdapterState:
    out = state.with_tensors({k: v * scale for k, v in state.tensors.items()},
                             version=state.version if version is None else version)
    return out if name is None else LoraAdapterState(name, out.version, out.config, out.tensors, out.base_model_path)


def _published_requests(env: ConformanceEnv, name: str, seed: int, tag: str) -> list[ClientRequest]:
    # long enough to fill KV blocks on every engine: a republished name's stale KV is only served from full blocks
    return [ClientRequest(f"{r.request_id}-{tag}", r.prompt_ids, r.max_tokens, adapter=name)
            for r in make_prompts(env, 3, seed=seed, max_tokens=5, adapter_every=1,
                                  length_range=(PREFIX_SPAN, PREFIX_SPAN + 16))]


@check("publish_adapter")
def check_publish_adapter__version_keeps_its_weights_when_training_moves_on(env: ConformanceEnv) -> None:
    """As the core does it: the weights in the fine-tuning slot are published, then training installs the next
    version. The published name keeps serving the weights it was published with; a host that serves it from the
    training slot (an alias of a slot updated in place, not a copy) hands clients whatever the job trains next."""
    trained = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-kept", version=11)
    original = env.finetune_state
    env.host.set_finetune_adapter(handed_copy(trained))  # type: ignore[attr-defined]
    try:
        name = env.host.publish_adapter(handed_copy(trained))  # type: ignore[attr-defined]
        env.host.set_finetune_adapter(handed_copy(_scaled(trained, -2.5, version=12)))  # type: ignore[attr-defined]
        requests = _published_requests(env, name, seed=61, tag="kept")
        problems = _greedy_problems(env, env.run(requests), requests, lambda r: trained)
    finally:
        env.host.set_finetune_adapter(handed_copy(original))  # type: ignore[attr-defined]
    if problems:
        raise _fail(env, "publish_adapter", f"{name!r} was published from the fine-tuning slot's weights (version "
                    "11), then set_finetune_adapter installed version 12: expected version 11 still served; "
                    + "; ".join(problems[:3]))


@check("publish_adapter")
def check_publish_adapter__republished_name_serves_the_new_weights(env: ConformanceEnv) -> None:
    """Publishing a name again (same adapter name and version: a restarted job redoing a step) replaces its
    weights: later requests get the new weights, never the first ones (or KV computed with them)."""
    client = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-redo", version=21)
    first = env.host.publish_adapter(handed_copy(client))  # type: ignore[attr-defined]
    requests = _published_requests(env, first, seed=62, tag="first")
    env.run(requests)  # the first weights served (and cached, on hosts that cache) under the name
    redone = _scaled(client, -3.0)
    second = env.host.publish_adapter(handed_copy(redone))  # type: ignore[attr-defined]
    again = [ClientRequest(f"{r.request_id}-again", r.prompt_ids, r.max_tokens, adapter=second) for r in requests]
    problems = _greedy_problems(env, env.run(again), again, lambda r: redone)
    if problems:
        raise _fail(env, "publish_adapter", f"version 21 published twice ({first!r}, then {second!r} with weights "
                    "x -3): expected the second publish's weights; " + "; ".join(problems[:3]))


@check("publish_adapter")
def check_publish_adapter__requests_in_flight_keep_their_adapter(env: ConformanceEnv) -> None:
    """A publish that lands while requests decode leaves them on the adapter they were submitted on. The requests
    run on a version of weights no other adapter holds, and the version published mid-flight is named to sort
    first, so a host that rebuilds a sorted adapter table on publish (and keeps running requests' old slot
    indices) moves them onto another adapter's weights mid-request."""
    client = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="m-inflight-own", version=32)
    own = _scaled(client, 1.7)
    own_name = env.host.publish_adapter(handed_copy(own))  # type: ignore[attr-defined]
    requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=own_name if r.adapter else None)
                for r in make_prompts(env, 4, seed=63, max_tokens=10, adapter_every=2, prefix="inflight")]
    for r in requests:
        env.host.submit(r)  # type: ignore[attr-defined]
    outputs: list[ClientOutput] = []
    for _ in range(3):
        outputs.extend(env.host.step())  # type: ignore[attr-defined]
    name = env.host.publish_adapter(handed_copy(_scaled(client, 2.0, name="0-inflight", version=31)))  # type: ignore[attr-defined]
    outputs.extend(env.run_stepwise([]))
    problems = _greedy_problems(env, outputs, requests, lambda r: own if r.adapter else None)
    if problems:
        raise _fail(env, "publish_adapter", f"{name!r} was published after 3 steps of requests on {own_name!r} and "
                    "the base model: expected each to keep its own adapter; " + "; ".join(problems[:3]))


@check("driver")
def check_driver__run_idle_step_never_loses_pending_client_work(env: ConformanceEnv) -> None:
    """``run_idle_step()`` called while client requests are pending (submitted, not yet run: requests that arrived
    between the core's idle check and the call) loses nothing: each is served and its output returned by a later
    ``step()``, exactly once, also one short enough to finish in its prefill step. A step the call offers to
    ``on_schedule`` lists each of them in ``scheduled`` or ``waiting`` (ProposedBatch: every request that arrived and
    has not finished): an idle path that offers an empty batch without asking its queue hides them from the
    admission that prices the fine-tuning step against them."""
    # one of them finishes in its prefill step: if the idle step runs it, that step's outputs have nowhere to go
    pending = [ClientRequest(r.request_id, r.prompt_ids, 1 if i == 0 else 4, adapter=r.adapter)
               for i, r in enumerate(make_prompts(env, 2, seed=64, prefix="pending"))]
    sample = make_samples(env, 1, lengths=[10], seed=64, first_id=2600)
    rec = Recorder(inject=lambda batch: sample if not batch.scheduled else ())
    env.install(rec)
    for r in pending:
        env.host.submit(r)  # type: ignore[attr-defined]
    env.host.run_idle_step()  # type: ignore[attr-defined]
    offered = list(rec.batches)
    env.install(None)
    problems = [f"step {b.step_id}, offered by run_idle_step(), lists {sorted(missing)} in neither scheduled nor "
                "waiting" for b in offered
                if (missing := {r.request_id for r in pending}
                    - {v.request_id for v in (*b.scheduled, *b.waiting)})]
    outputs = env.run_stepwise([])
    got = [o.request_id for o in outputs]
    problems += [f"{r.request_id}: returned {got.count(r.request_id)} times" for r in pending
                 if got.count(r.request_id) != 1]
    if not problems:
        problems = _greedy_problems(env, outputs, pending,
                                    lambda r: env.client_adapter_dir if r.adapter == env.client_adapter else None)
    if problems:
        raise _fail(env, "driver", "requests pending when run_idle_step() was called: expected each listed in any "
                    "batch the call offered and served and returned by a later step() exactly once; "
                    + "; ".join(problems[:3]))


# ------------------------------------------------------------------------------------------ blind batch 2026-12-06b:
# generate() beside submit() (h16) and retracting one published version (h28)


def _fail_on(env: ConformanceEnv, hook: str, setting: str, problems: list[str]) -> None:
    """Fail with what the check did (``setting``) and its first problems, when it found any."""
    if problems:
        raise _fail(env, hook, setting + "; ".join(problems[:3]))


@check("driver")
def check_driver__generate_keeps_other_requests_outputs_for_step(env: ConformanceEnv) -> None:
    """``generate()`` called while a request submitted earlier with ``submit()`` still runs (a server's traffic and a
    test's batch on one engine): the earlier request finishes during the call, and its output is neither in
    generate's result nor lost. ``has_unfinished()`` stays True after the call, and the next ``step()`` returns it,
    exactly once, with its own adapter's tokens. A generate() that steps the engine keeping only its own requests'
    outputs (as vLLM's ``LLM._run_engine`` does) hands it to no call."""
    import dataclasses

    if env.host.has_unfinished():  # type: ignore[attr-defined]
        env.run_stepwise([])  # what was left is another check's concern
    earlier, *given = make_prompts(env, 3, seed=65, adapter_every=1, prefix="kept-beside")
    earlier = dataclasses.replace(earlier, max_tokens=2)
    given = [dataclasses.replace(r, max_tokens=4, adapter=None) for r in given]
    env.host.submit(earlier)  # type: ignore[attr-defined]
    returned = list(env.host.step())  # type: ignore[attr-defined]  # its prefill: one token to go
    before = [o.request_id for o in returned]
    outputs = env.run(given)
    in_result = [o.request_id for o in outputs if o.request_id == earlier.request_id]
    unfinished = env.host.has_unfinished()  # type: ignore[attr-defined]
    following = list(env.host.step())  # type: ignore[attr-defined]
    returned += following + env.run_stepwise([])
    ours = [o for o in returned if o.request_id == earlier.request_id]
    problems = []
    if in_result:
        problems.append(f"generate() returned {earlier.request_id!r}'s output among its own")
    if not ours:
        problems.append(f"{earlier.request_id!r}'s output was returned by no step() (outputs seen: "
                        f"{[o.request_id for o in returned]})")
    elif len(ours) > 1:
        problems.append(f"{earlier.request_id!r}'s output was returned {len(ours)} times")
    elif earlier.request_id not in before:
        if not unfinished:
            problems.append("has_unfinished() was False after generate() returned, with its output not yet returned")
        if ours[0] not in following:
            problems.append(f"the step() after generate() returned {[o.request_id for o in following]}, not "
                            f"{earlier.request_id!r}'s output")
    if ours and not problems:
        problems = _greedy_problems(env, ours, [earlier], lambda r: env.client_adapter_dir)
    _fail_on(env, "driver", f"{earlier.request_id!r} (submit(), 2 tokens, on {earlier.adapter!r}) was one token from "
             f"done when generate() ran {[r.request_id for r in given]} (4 tokens each); expected its output kept for "
             "the next step(), exactly once: ", problems)


@check("retract_adapter")
def check_retract_adapter__withdraws_exactly_that_version(env: ConformanceEnv) -> None:
    """The core prunes old versions with ``retract_adapter``: after version 4 of an adapter is retracted, a request
    naming it is refused by ``submit()`` (raising, nothing queued) as one naming an adapter the host never loaded,
    while version 42 of the same adapter, the client adapter and the base model keep serving their own weights. A
    host that unloads by the job's adapter name withdraws every version with the oldest; one that forgets the name
    but not the slot, or maps it to no adapter, serves the retracted version's clients on some other weights. The
    kept version's published name (``...@v42``) extends the retracted one's (``...@v4``): a host that unloads every
    adapter whose name starts with the retracted name withdraws it too (blind batch 2026-12-07b, h21)."""
    source = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-retract", version=4)
    old, new = _scaled(source, 1.5), _scaled(source, -2.0, version=42)
    old_name = env.host.publish_adapter(handed_copy(old))  # type: ignore[attr-defined]
    new_name = env.host.publish_adapter(handed_copy(new))  # type: ignore[attr-defined]
    # both served once before the retraction, so each holds whatever slot or cache entry the host gives a version
    env.run([ClientRequest(f"{r.request_id}-{i}", r.prompt_ids, 2, adapter=name) for i, (r, name) in
             enumerate(zip(make_prompts(env, 2, seed=66, prefix="retract-warm"), (old_name, new_name)))])
    env.host.retract_adapter(old_name)  # type: ignore[attr-defined]
    problems = []
    try:
        refused = ClientRequest("retracted-version", (5, 6, 7, 8), 2, adapter=old_name)
        env.host.submit(refused)  # type: ignore[attr-defined]
        problems.append(f"submit() accepted a request on the retracted {old_name!r}")
    except Exception:  # noqa: BLE001 - refusing is raising; which error is the host's choice
        pass
    if env.host.has_unfinished():  # type: ignore[attr-defined]
        problems.append(f"a request on the retracted {old_name!r} was queued")
        env.run_stepwise([])
    adapters = (new_name, env.client_adapter, None)
    requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=adapters[i % 3])
                for i, r in enumerate(make_prompts(env, 6, seed=67, max_tokens=5, prefix="after-retract"))]
    try:
        outputs = env.run(requests)
    except Exception as exc:  # noqa: BLE001 - a host that withdrew the other versions refuses their requests
        problems.append(f"generate() on {new_name!r}, the client adapter and the base model raised {exc!r}")
    else:
        weights = {new_name: new, env.client_adapter: env.client_adapter_dir, None: None}
        problems += _greedy_problems(env, outputs, requests, lambda r: weights[r.adapter])
    _fail_on(env, "retract_adapter", f"{old_name!r} and {new_name!r} were published, then {old_name!r} retracted: "
             "expected it refused as an unknown adapter and every other adapter served as before; ", problems)


@check("retract_adapter")
def check_retract_adapter__requests_in_flight_finish_on_their_version(env: ConformanceEnv) -> None:
    """The core retracts the oldest version right after a publish, while its clients may still be decoding: requests
    submitted on a version before ``retract_adapter`` (two running, one still queued) finish on its weights, every
    token, never failed, cut short or moved to another adapter. A host that frees the version's weights at once fails
    their next step; one that maps a missing adapter to none serves the rest of them on the base model. Then a second
    version is retracted while its requests are all still queued behind base-model requests holding every running
    slot: they too finish on its weights (a host that frees a version once no *running* request names it does not)."""
    source = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-retract-running", version=51)
    state = _scaled(source, 1.3)
    name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
    prompts = make_prompts(env, 3, seed=68, max_tokens=6, adapter_every=1, prefix="retract-running")
    requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=name) for r in prompts]
    for r in requests[:2]:
        env.host.submit(r)  # type: ignore[attr-defined]
    outputs: list[ClientOutput] = []
    for _ in range(2):
        outputs.extend(env.host.step())  # type: ignore[attr-defined]
    env.host.submit(requests[2])  # type: ignore[attr-defined]  # queued: no step has run since
    env.host.retract_adapter(name)  # type: ignore[attr-defined]
    # The version stays resident while those requests run, yet a new request naming it is refused from now on, as
    # one naming an adapter the host never loaded (blind batch 2026-12-07c, h22: names resolved against resident
    # slots).
    late = ClientRequest("retract-running-late", prompts[0].prompt_ids, 2, adapter=name)
    try:
        env.host.submit(late)  # type: ignore[attr-defined]
    except ValueError:
        late = None
    try:
        outputs.extend(env.run_stepwise([]))
    except Exception as exc:  # noqa: BLE001 - the step itself failing is what this check is about
        try:  # the name served again lets the stranded requests finish, so later checks start on an empty engine
            env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
            env.run_stepwise([])
        except Exception:  # noqa: BLE001 - the failure to report is the one above
            pass
        raise _fail(env, "retract_adapter", f"{name!r} was retracted with two requests on it running and one queued: "
                    f"a later step raised {exc!r}; expected them to finish on its weights") from None
    if late is not None:
        raise _fail(env, "retract_adapter", f"submit() accepted a request on {name!r} after retract_adapter({name!r}) "
                    "(while earlier requests on it still ran); expected it refused with ValueError, as a request on "
                    "an adapter the host never loaded")
    _fail_on(env, "retract_adapter", f"{name!r} was retracted with two requests on it running and one queued: "
             "expected each to finish on its weights; ", _greedy_problems(env, outputs, requests, lambda r: state))
    _queued_requests_finish_on_a_retracted_version(env, source)


def _queued_requests_finish_on_a_retracted_version(env: ConformanceEnv, source: LoraAdapterState) -> None:
    """Requests on a version still *queued* when it is retracted, none of them running: every running-request slot
    is held by base-model requests that outlive several steps, so the version's requests wait behind them (any load
    where requests wait). They finish on its weights too: a host that frees a retracted version once no *running*
    request names it (a LoRA manager that pins only the scheduled requests' adapters) runs them on the base model
    (blind batch 2026-12-07, h09)."""
    state = _scaled(source, 1.8, version=52)
    name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
    cap = env.config.max_running_requests if env.config is not None else 32
    holders = [ClientRequest(r.request_id, r.prompt_ids, 8, adapter=None)
               for r in make_prompts(env, cap, seed=69, adapter_every=0, prefix="retract-slot-holder")]
    queued = [ClientRequest(r.request_id, r.prompt_ids, 4, adapter=name)
              for r in make_prompts(env, 3, seed=70, adapter_every=0, prefix="retract-queued")]
    for r in holders + queued:
        env.host.submit(r)  # type: ignore[attr-defined]
    env.host.retract_adapter(name)  # type: ignore[attr-defined]
    setting = (f"{name!r} was retracted with {len(queued)} requests on it queued behind {cap} base-model requests "
               f"holding every running slot (max_running_requests={cap}), none of its own running")
    try:
        outputs = env.run_stepwise([])
    except Exception as exc:  # noqa: BLE001 - the step itself failing is what this check is about
        try:
            env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
            env.run_stepwise([])
        except Exception:  # noqa: BLE001 - the failure to report is the one above
            pass
        raise _fail(env, "retract_adapter", f"{setting}: a later step raised {exc!r}; expected them to finish on its "
                    "weights") from None
    _fail_on(env, "retract_adapter", f"{setting}: expected each to finish on its weights; ",
             _greedy_problems(env, outputs, queued, lambda r: state))


# ------------------------------------------------------------------------------------------ blind batch 2026-12-07c


@check("intercept_schedule")
def check_intercept_schedule__request_submitted_between_steps_is_in_the_next_offer(env: ConformanceEnv) -> None:
    """A request whose ``submit`` returned before the host proposed a step has arrived, so the very next batch
    offered to ``on_schedule`` lists it, scheduled or waiting: while other requests decode (every arrival under
    load), several at once, one on the client adapter, and on an idle engine. Blind batch 2026-12-07c, h14: an inbox
    drained into the waiting queue only after the step was proposed, so the offer after each arrival missed it. (An
    arrival from another thread during a step may miss the offer already being formed; one between steps may not.)"""
    rec = Recorder()
    env.install(rec)
    problems: list[str] = []

    def arrive(requests: list[ClientRequest], when: str) -> None:
        for r in requests:
            env.host.submit(r)  # type: ignore[attr-defined]
        offered = len(rec.batches)
        for _ in range(5):  # a step() that only finishes work formed earlier offers nothing; the next offer counts
            env.host.step()  # type: ignore[attr-defined]
            if len(rec.batches) > offered:
                break
        else:
            problems.append(f"{when}: no batch was offered in 5 step() calls after the submit")
            return
        b = rec.batches[offered]
        listed = {r.request_id for r in b.scheduled + b.waiting}
        missing = [r.request_id for r in requests if r.request_id not in listed]
        if missing:
            problems.append(f"{when}: step {b.step_id}, the first offered after submit() returned, lists "
                            f"{sorted(listed)} in scheduled/waiting but not {missing}")

    running = make_prompts(env, 1, seed=171, max_tokens=24, adapter_every=0, prefix="between-running")[0]
    env.host.submit(running)  # type: ignore[attr-defined]
    _step_until_decoding(env, rec, running.request_id)
    arrive(make_prompts(env, 1, seed=172, max_tokens=3, adapter_every=0, prefix="between-one"),
           "one request submitted while another decodes")
    arrive(make_prompts(env, 3, seed=173, max_tokens=3, adapter_every=2, prefix="between-three"),
           "three requests (one on the client adapter) submitted while others decode")
    env.run_stepwise([])
    arrive(make_prompts(env, 1, seed=174, max_tokens=2, adapter_every=1, prefix="between-idle"),
           "a client-adapter request submitted to an idle engine")
    env.run_stepwise([])
    if problems:
        raise _fail(env, "intercept_schedule", "every request that arrived and has not finished must be in scheduled "
                    "or waiting; " + "; ".join(problems))


@check("intercept_schedule")
def check_intercept_schedule__a_reused_request_id_is_a_new_request(env: ConformanceEnv) -> None:
    """A request id may be submitted again once its request's output was returned (clients number requests per
    session or per benchmark run), and the hooks then see a new request: on_arrival again, and in every offer no
    token, token time or output count of the earlier one (no first token before its own prefill, no token time
    before it was submitted). Reused after ``generate()`` and after ``submit()``/``step()``, on the base model and the
    client adapter, while another request decodes. Blind batch 2026-12-07c, h16: a first-token clock keyed by request
    id, forgotten only on abort, gave the reused id the old request's first-token time."""
    first = make_prompts(env, 2, seed=175, max_tokens=4, adapter_every=2, prefix="reused")
    env.run(first)
    rec = Recorder()
    env.install(rec)
    problems: list[str] = []

    def reuse(old: ClientRequest, new: ClientRequest, how: str, serve) -> None:  # noqa: ANN001
        offered, told, since = len(rec.batches), len(rec.arrivals), time.monotonic()
        outputs: list[ClientOutput] = serve([new])
        arrivals = [t for rid, t in rec.arrivals[told:] if rid == new.request_id]
        if len(arrivals) != 1:
            problems.append(f"{how}: on_arrival came {len(arrivals)} times for the reused id {new.request_id!r}")
        for b in rec.batches[offered:]:
            for v in b.scheduled + b.waiting:
                if v.request_id != new.request_id:
                    continue
                bad = []
                if v.arrival_time < since:
                    bad.append(f"arrival_time {v.arrival_time:.6f}")
                if v.output_tokens == 0 and (v.first_token_time is not None or v.last_token_time is not None):
                    bad.append(f"first_token_time {v.first_token_time} with output_tokens 0")
                else:
                    bad.extend(f"{name} {getattr(v, name):.6f}" for name in ("first_token_time", "last_token_time")
                               if getattr(v, name) is not None and getattr(v, name) < since)
                if v.output_tokens >= new.max_tokens:
                    bad.append(f"output_tokens {v.output_tokens} (max_tokens {new.max_tokens})")
                if bad:
                    problems.append(f"{how}: step {b.step_id} offers {new.request_id!r} "
                                    f"({'prefill' if v.prefill_tokens else 'decode'}) with {', '.join(bad)}, but "
                                    f"this request was submitted at {since:.6f}: those belong to the earlier request "
                                    f"of that id (prompt of {len(old.prompt_ids)} tokens)")
                    return
        out = [o for o in outputs if o.request_id == new.request_id]
        if len(out) != 1 or len(out[0].token_ids) != new.max_tokens or out[0].arrival_time < since:
            problems.append(f"{how}: the client got {[(len(o.token_ids), o.arrival_time) for o in out]} (tokens, "
                            f"arrival_time) for {new.request_id!r}; expected one output of {new.max_tokens} tokens "
                            f"arriving at or after {since:.6f}")

    # again through generate(), another prompt under the same id
    for old, salt in zip(first, (1, 2)):
        new = ClientRequest(old.request_id, make_prompts(env, 1, seed=176, token_salt=salt)[0].prompt_ids, 5,
                            adapter=old.adapter)
        reuse(old, new, f"{old.request_id!r} reused by generate()", env.run)
    # again through submit() while another request decodes, then a third time
    old = first[0]
    other = make_prompts(env, 1, seed=177, max_tokens=12, adapter_every=0, prefix="reused-beside")[0]
    env.host.submit(other)  # type: ignore[attr-defined]
    _step_until_decoding(env, rec, other.request_id)
    for salt in (3, 4):
        new = ClientRequest(old.request_id, make_prompts(env, 1, seed=176, token_salt=salt)[0].prompt_ids, 3)
        reuse(old, new, f"{old.request_id!r} reused by submit() beside a decode", env.run_stepwise)
    if problems:
        raise _fail(env, "intercept_schedule", "a reused request id must be a new request in every hook; "
                    + "; ".join(problems[:3]))


@check("intercept_schedule", requires=_needs_abort)
def check_intercept_schedule__request_arriving_during_an_aborted_step_is_served(env: ConformanceEnv) -> None:
    """Requests submitted from another thread while a fine-tuning-only step runs, which the core then aborts at the
    next layer boundary because they arrived (the situation aborts exist for), are served in full: has_unfinished()
    is True once the aborted step returns, and step() brings their outputs. Blind batch 2026-12-07c, h28: an aborted
    step put the waiting queue back as it was before the forward (a failed step's retry path), losing the arrivals."""
    samples = make_samples(env, 2, lengths=[9, 12], seed=178, first_id=17800)
    late = make_prompts(env, 2, seed=178, max_tokens=3, adapter_every=2, prefix="aborting-arrival")
    fired: list[int] = []
    rec = Recorder(inject=_inject_into_first_idle(samples, fired))
    ids = {r.request_id for r in late}
    # the core's should_abort: True once a client request has arrived during the step
    rec.should_abort = lambda step_id: (Recorder.should_abort(rec, step_id)  # type: ignore[method-assign]
                                        or bool(ids & {rid for rid, _ in rec.arrivals}))

    def arrive() -> None:
        for r in late:
            env.host.submit(r)  # type: ignore[attr-defined]

    seen = _call_from_a_thread_during_the_first_layer_input(rec, arrive, 2.0, "conformance-aborting-arrival")
    env.install(rec)
    env.host.run_idle_step()  # type: ignore[attr-defined]
    if seen.thread is not None:
        seen.thread.join(timeout=30.0)
    if not fired or seen.thread is None:
        raise _fail(env, "intercept_schedule", "run_idle_step() ran no fine-tuning-only step that delivered a layer "
                    "input, so no request could arrive during one")
    if "error" in seen:
        raise _fail(env, "intercept_schedule", f"submit() from another thread during fine-tuning-only step "
                    f"{fired[0]} raised {type(seen['error']).__name__}: {seen['error']}; expected the request accepted")
    record = rec.record_for(fired[0])
    aborted = bool(record and record.aborted_sample_ids)
    pending = env.host.has_unfinished()  # type: ignore[attr-defined]
    outputs = []
    for _ in range(200):
        if not env.host.has_unfinished():  # type: ignore[attr-defined]
            break
        outputs.extend(env.host.step())  # type: ignore[attr-defined]
    got = {o.request_id: len(o.token_ids) for o in outputs}
    lost = sorted(r.request_id for r in late if got.get(r.request_id) != r.max_tokens)
    if lost or not pending:
        raise _fail(env, "intercept_schedule", f"{sorted(ids)} were submitted from another thread during "
                    f"fine-tuning-only step {fired[0]} ({'aborted' if aborted else 'not aborted'}: record "
                    f"{record}); has_unfinished() after it: {pending}; outputs (id: tokens) {got}; expected each "
                    f"request to join a later step and get its {late[0].max_tokens} tokens, never lost")
