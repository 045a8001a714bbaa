"""Checks of operations that meet while client requests are in flight or after training moved on: a published
version against later training and a republish of its name, a publish landing while requests on another adapter
decode, and ``run_idle_step`` called with client work pending.

Each was missing until a blind batch of broken hosts (2026-12-04) went through the suite unseen; they register into
:data:`.checks.CHECKS` like the fixed checks there.
"""

from __future__ import annotations

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientOutput, ClientRequest

from .checks import _fail, _greedy_problems, check
from .harness import PREFIX_SPAN, ConformanceEnv, handed_copy, make_prompts

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
    ``step()``, exactly once, also one short enough to finish in its prefill step."""
    # one of them finishes in its prefill step: if the idle step runs it, that step's outputs have nowhere to go
    pending = [ClientRequest(r.request_id, r.prompt_ids, 1 if i == 0 else 4, adapter=r.adapter)
               for i, r in enumerate(make_prompts(env, 2, seed=64, prefix="pending"))]
    for r in pending:
        env.host.submit(r)  # type: ignore[attr-defined]
    env.host.run_idle_step()  # type: ignore[attr-defined]
    outputs = env.run_stepwise([])
    got = [o.request_id for o in outputs]
    problems = [f"{r.request_id}: returned {got.count(r.request_id)} times" for r in pending
                if got.count(r.request_id) != 1]
    if not problems:
        problems = _greedy_problems(env, outputs, pending,
                                    lambda r: env.client_adapter_dir if r.adapter == env.client_adapter else None)
    if problems:
        raise _fail(env, "driver", "requests pending when run_idle_step() was called: expected each served and "
                    "returned by a later step() exactly once; " + "; ".join(problems[:3]))
