"""Generated and stateful checks: the contract's invariants over inputs hypothesis draws, not a few fixed ones.

The fixed checks of :mod:`.checks` each drive one small, chosen situation. Hosts break where those situations do
not reach: a third fine-tuning row in a step, a prompt crossing a 16-token KV block, samples injected longest
first, a step filled to the token budget, a publish or a second ``set_finetune_adapter`` while requests are in
flight. Two broad checks cover that space:

- ``generated__scenarios_keep_every_invariant`` (as array-api-tests does): a scenario is a set of client requests
  (lengths around KV-block and capture-size boundaries, outputs now and then past 16 and 32 tokens, staggered
  arrivals, past the host's running-request cap, sent with ``submit`` or the first ones with ``generate``) and
  fine-tuning injections (row counts beyond two, any order, arbitrary ids, shared template prefixes, one step filled
  to the host's token budget, rows beside a step whose client rows take every running slot); every invariant is
  checked once it has run.
- ``stateful__interleaved_operations_keep_every_invariant`` (a ``RuleBasedStateMachine``, as zarr's stateful store
  tests do): submits, ``generate`` calls, steps with injections, fine-tuning-only steps with and without abort,
  ``set_finetune_adapter`` with new weights, publishes and profile steps, in any order the contract allows, with the
  invariants checked after every rule.

Besides what each step ran, the invariants keep plain bookkeeping over the requests submitted: on_arrival once per
request whichever call sent it, every arrived and unfinished request listed in each offered batch, a request's
``first_token_time`` never moving once set, ``generate`` returning one output per request in request order.

Everything is judged against :class:`~.independent.IndependentModel` (transformers + PEFT), never against another
path of the host. A failure names the invariant (the rule), what was expected and what happened, plus
hypothesis's falsifying example and the seed that replays it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientOutput, ClientRequest
from deltaserve_core.types import ExecutionMode, FineTuneSample, HostCapabilities, ProfileShape, ProposedBatch

from .checks import RuleViolation, _call_order_problems, _fail, check, unlisted_requests
from .harness import PROFILES, ConformanceEnv, Recorder, handed_copy

__all__ = ["Scenario", "Invariants"]

#: Lengths where engines change behaviour: KV blocks of 16 tokens (vLLM, SGLang's page size), CUDA-graph capture
#: sizes (1, 2, 4, 8, 16, 32, ...), and one either side of each.
_BOUNDARIES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65)


def _lengths(lo: int, hi: int):  # noqa: ANN202 - a hypothesis strategy
    from hypothesis import strategies as st

    near = [b for b in _BOUNDARIES if lo <= b <= hi]
    return st.one_of(st.sampled_from(near), st.integers(lo, hi)) if near else st.integers(lo, hi)


def _settings(env: ConformanceEnv, examples: int, steps: int | None = None):  # noqa: ANN202
    from hypothesis import HealthCheck, Phase, settings

    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if PROFILES[env.profile].shrink else [])
    kwargs: dict[str, Any] = {"stateful_step_count": steps} if steps else {}
    return settings(max_examples=examples, deadline=None, database=None, phases=phases, print_blob=True,
                    derandomize=False, report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                    **kwargs)


def _rethrow(env: ConformanceEnv, rule: str, exc: BaseException) -> AssertionError:
    """An AssertionError carrying hypothesis's falsifying example (its notes) and the seed."""
    notes = "\n    ".join(getattr(exc, "__notes__", []) or [])
    message = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
    return RuleViolation(getattr(exc, "hook", None), f"{message}\n  {rule} failed on a generated example "
                         f"(hypothesis seed {env.seed}, profile {env.profile}):\n    {notes}")


# ------------------------------------------------------------------------------------------ invariants


def _weights_of(env: ConformanceEnv, adapter: str | None) -> Path | None:
    return env.client_adapter_dir if adapter == env.client_adapter else None


@dataclass
class Invariants:
    """What must hold of everything a host did while a :class:`Recorder` watched, judged incrementally."""

    env: ConformanceEnv
    rec: Recorder
    caps: HostCapabilities
    #: step id -> fine-tuning weights in force when the step was offered (what its captures must equal)
    weights_at_step: dict[int, LoraAdapterState] = field(default_factory=dict)
    #: step ids in which should_abort was scripted to fire, and the layer boundary it fires at
    abort_at: dict[int, int] = field(default_factory=dict)
    synthetic_steps: set[int] = field(default_factory=set)
    #: request id -> (request, candidate weights: every version its adapter name held while it ran)
    submitted: dict[str, tuple[ClientRequest, list[Any]]] = field(default_factory=dict)
    outputs: dict[str, ClientOutput] = field(default_factory=dict)
    #: request id -> (first_token_time first offered, that step)
    first_token_times: dict[str, tuple[float, int]] = field(default_factory=dict)
    _records_done: int = 0
    _steps_done: set[int] = field(default_factory=set)
    _first_times_done: int = 0

    def fail(self, hook: str, message: str) -> AssertionError:
        return _fail(self.env, hook, message)

    def take_outputs(self, outputs: Sequence[ClientOutput]) -> None:
        """Outputs handed to clients: only client requests, each once, each transformers+PEFT's greedy tokens."""
        for out in outputs:
            if out.request_id not in self.submitted:
                raise self.fail("intercept_schedule", f"a client received output {out.request_id!r}, which is no "
                                "client request (expected outputs only for submitted requests: a fine-tuning or "
                                "synthetic row leaked)")
            if out.request_id in self.outputs:
                raise self.fail("intercept_schedule", f"request {out.request_id!r} was handed out twice")
            self.outputs[out.request_id] = out
            request, candidates = self.submitted[out.request_id]
            if len(out.token_ids) != request.max_tokens:
                raise self.fail("intercept_schedule", f"request {out.request_id!r} expected {request.max_tokens} "
                                f"tokens (ignore_eos), got {len(out.token_ids)}")
            misses = [self.env.independent.greedy_mismatch(w, request.prompt_ids, out.token_ids) for w in candidates]
            if all(m is not None for m in misses):
                where = "the base model" if request.adapter is None else f"adapter {request.adapter!r}"
                versions = ("" if len(candidates) < 2 else
                            f" under any one of the {len(candidates)} versions it held while the request ran")
                raise self.fail("intercept_schedule", f"request {out.request_id!r} on {where} "
                                f"({len(request.prompt_ids)}-token prompt): expected transformers+PEFT's greedy "
                                f"tokens{versions}; {misses[0].describe()}")  # type: ignore[union-attr]

    def check_arrivals(self) -> None:
        counts = Counter(rid for rid, _ in self.rec.arrivals)
        wrong = {rid: counts.get(rid, 0) for rid in self.submitted if counts.get(rid, 0) != 1}
        foreign = sorted(set(counts) - set(self.submitted))
        if wrong or foreign:
            raise self.fail("intercept_schedule", f"expected on_arrival once per client request; calls per request "
                            f"{wrong}" + (f", and for ids that are no client request: {foreign}" if foreign else ""))

    def check_steps(self) -> None:
        """Records, composition, fine-tuning rows, captures, modes and call order of every step reported so far."""
        rec, env = self.rec, self.env
        new = rec.records[self._records_done:]
        self._records_done = len(rec.records)
        seen = [r.step_id for r in rec.records if r.step_id not in self.synthetic_steps]
        if len(seen) != len(set(seen)):
            raise self.fail("report_step_time", f"expected one record per step; step ids reported twice: "
                            f"{sorted(s for s, n in Counter(seen).items() if n > 1)}")
        if seen != sorted(seen):
            raise self.fail("report_step_time", f"expected records in step order; got step ids {seen}")
        scheduled = Counter(b.step_id for b in rec.batches)
        twice = sorted(s for s, n in scheduled.items() if n > 1)
        if twice:
            raise self.fail("intercept_schedule", f"expected on_schedule once per step; steps {twice} were offered "
                            "more than once")
        num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
        for record in new:
            if record.synthetic:
                continue
            step = record.step_id
            self._steps_done.add(step)
            batch = rec.batch_for(step)
            if batch is None:
                raise self.fail("intercept_schedule", f"step {step} ran without being offered to on_schedule")
            proposed = (tuple(sorted(batch.prefill_lengths)), batch.num_decode, batch.kv_tokens)
            ran = (tuple(sorted(record.prefill_lengths)), record.num_decode, record.kv_tokens)
            if proposed != ran:
                raise self.fail("report_step_time", f"step {step}: expected the record to show the proposed "
                                f"composition (prefill lengths, decodes, KV) {proposed}; it shows {ran}")
            injected = rec.injected.get(step, ())
            want = {s.sample_id: s.num_tokens for s in injected}
            done = dict(zip(record.finetune_sample_ids, record.finetune_lengths))
            aborted = set(record.aborted_sample_ids)
            if step in self.abort_at:
                if aborted != set(want) or done:
                    raise self.fail("capture_activation", f"step {step} was aborted at layer boundary "
                                    f"{self.abort_at[step]}: expected aborted_sample_ids {sorted(want)} and no "
                                    f"completed rows; the record says completed {done}, aborted {sorted(aborted)}")
                late = sorted({layer for s, layer, _, _ in rec.captures if s == step
                               and layer >= self.abort_at[step]})
                if late:
                    raise self.fail("capture_activation", f"step {step}: should_abort returned True before layer "
                                    f"{self.abort_at[step]} but layers {late} were still captured")
            elif (not done and aborted == set(want) and
                  len({self.submitted[r.request_id][0].adapter for r in batch.scheduled
                       if r.request_id in self.submitted} - {None}) >= 3):
                # HostCapabilities does not advertise LoRA slots per step: with three client adapters in the step
                # besides the reserved one, a host may refuse the samples, but only all of them and reported as
                # aborted (back to the core's pool), never silently (vLLM's max_loras)
                pass
            elif len(batch.scheduled) + len(want) > _limits(env)[1]:
                # rows beyond the running-request slots (an engine that counts each row as a sequence) may be refused,
                # but in this step's record: each one run whole or refused, none dropped, none carried on
                if set(done) | aborted != set(want) or set(done) & aborted or any(want[s] != n for s, n in done.items()):
                    raise self.fail("intercept_schedule", f"step {step}: injected fine-tuning rows (id: tokens) {want} "
                                    f"beside {len(batch.scheduled)} client rows, over max_running_requests="
                                    f"{_limits(env)[1]}; expected each run whole or refused (aborted_sample_ids) in "
                                    f"that step, the record lists completed {done}, aborted {sorted(aborted)}")
            elif done != want or aborted:
                raise self.fail("intercept_schedule", f"step {step}: injected fine-tuning rows (id: tokens) {want} "
                                f"within the host's caps; expected all run whole in that step, the record lists "
                                f"completed {done}, aborted {sorted(aborted)}")
            # Rows the host refused never ran (the step is a client step, which may replay a graph); rows it ran
            # whole, or stopped at a layer boundary, did run and must have been captured.
            if (done or step in self.abort_at) and record.mode is not ExecutionMode.EAGER:
                raise self.fail("graph_mode", f"step {step} carried fine-tuning rows but ran {record.mode.value}; "
                                "expected eager")
            if not (done or step in self.abort_at):  # nothing injected, or every row refused: the step as proposed
                predicted = env.host.graph_mode(batch)  # type: ignore[attr-defined]
                if not predicted is batch.mode is record.mode:
                    raise self.fail("graph_mode", f"step {step} ({proposed}): expected graph_mode(), the proposed "
                                    f"mode and the record to agree; they say {predicted.value}, {batch.mode.value}, "
                                    f"{record.mode.value}")
            if record.mode not in self.caps.graph_modes:
                raise self.fail("graph_mode", f"step {step} ran {record.mode.value}, not a declared graph mode")
            captured = [(layer, sid, t) for s, layer, sid, t in rec.captures if s == step]
            foreign = sorted({sid for _, sid, _ in captured} - set(want))
            if foreign:
                raise self.fail("capture_activation", f"step {step}: expected captures only for fine-tuning rows "
                                f"{sorted(want)}; also got ids {foreign}")
            if step not in self.abort_at:  # rows refused in the record (past the running slots) capture nothing
                self._check_captures(step, [s for s in injected if s.sample_id in done], captured, num_layers)
        for step in {b.step_id for b in rec.batches if b.scheduled or b.step_id in rec.injected} - self._steps_done:
            later = [b.step_id for b in rec.batches if b.step_id > step and b.step_id in self._steps_done]
            if later:  # a step offered with requests, never reported, while later steps were
                raise self.fail("report_step_time", f"step {step} was offered with requests but no record came, "
                                f"although later steps {later[:3]} were reported")
        problems = _call_order_problems(rec)
        if problems:
            raise self.fail("capture_activation", "expected on_schedule → begin_step → layer inputs → end_step → "
                            "record per step; " + "; ".join(problems[:3]))
        self._check_bookkeeping()

    def _check_bookkeeping(self) -> None:
        """Plain bookkeeping over the client requests submitted: every offer lists each arrived, unfinished one; a
        request's first_token_time never moves once set."""
        rec = self.rec
        unlisted = unlisted_requests(rec, set(self.submitted))
        if unlisted:
            raise self.fail("intercept_schedule", "expected every arrived, unfinished client request in each offered "
                            "batch (scheduled or waiting); " + "; ".join(unlisted[:3]))
        for b in rec.batches[self._first_times_done:]:
            for r in b.scheduled + b.waiting:
                if r.first_token_time is None or r.request_id not in self.submitted:
                    continue
                known = self.first_token_times.setdefault(r.request_id, (r.first_token_time, b.step_id))
                if abs(known[0] - r.first_token_time) > 1e-9:
                    raise self.fail("intercept_schedule", f"request {r.request_id!r}: first_token_time was "
                                    f"{known[0]:.6f} in step {known[1]} and is {r.first_token_time:.6f} in step "
                                    f"{b.step_id} ({r.output_tokens} tokens out); expected it never to change once set")
        self._first_times_done = len(rec.batches)

    def _check_captures(self, step: int, injected: Sequence[FineTuneSample], captured: list, num_layers: int) -> None:
        env = self.env
        state = self.weights_at_step.get(step, env.finetune_state)
        for s in injected:
            got = [(layer, t) for layer, sid, t in captured if sid == s.sample_id]
            layers = [layer for layer, _ in got]
            if layers != list(range(num_layers)):
                raise self.fail("capture_activation", f"step {step} sample {s.sample_id}: expected one capture per "
                                f"layer 0..{num_layers - 1} in order; got layers {layers}")
            ref = env.independent.layer_inputs(state, s.input_ids)
            for layer, t in got:
                if tuple(t.shape) != tuple(ref[layer].shape):
                    raise self.fail("capture_activation", f"step {step} sample {s.sample_id} ({s.num_tokens} tokens) "
                                    f"layer {layer}: expected shape {tuple(ref[layer].shape)}, captured "
                                    f"{tuple(t.shape)}")
                err = (t - ref[layer]).abs().max().item()
                bound = env.tolerance * (1.0 + ref[layer].abs().max().item())
                if err > bound:
                    raise self.fail("capture_activation", f"step {step} sample {s.sample_id} ({s.num_tokens} tokens, "
                                    f"{len(injected)} rows in the step) layer {layer}: expected transformers+PEFT's "
                                    f"layer input under fine-tuning weights v{state.version}; differs by {err:.3g} "
                                    f"(allowed {bound:.3g})")


# ------------------------------------------------------------------------------------------ generated scenarios


@dataclass(frozen=True)
class Scenario:
    """Client requests ``(prompt length, max tokens, on the client adapter, arrives before step k)`` and, per
    injectable step in order, the fine-tuning sample lengths to inject (as drawn: any order); ``fill`` fills the
    first injectable step to that fraction of the host's remaining token budget with ``fill_rows`` rows."""

    requests: tuple[tuple[int, int, bool, int], ...]
    injections: tuple[tuple[int, ...], ...]
    template: int = 0
    fill: float = 0.0
    fill_rows: int = 1
    seed: int = 0
    #: send the requests due before the first step through ``generate()`` (the rest through ``submit()``)
    generate: bool = False


def _scenarios(max_requests: int):  # noqa: ANN202
    from hypothesis import strategies as st

    # outputs past 16 and 32 tokens now and then: scheduler-side windows of recent token times are that long
    new_tokens = st.one_of(st.integers(1, 6), st.integers(1, 6), st.sampled_from((17, 33, 40)))
    request = st.tuples(_lengths(1, 80), new_tokens, st.booleans(), st.integers(0, 3))
    return st.builds(
        Scenario,
        requests=st.lists(request, min_size=1, max_size=max_requests).map(tuple),
        injections=st.lists(st.lists(_lengths(2, 70), max_size=6).map(tuple), min_size=1, max_size=4).map(tuple),
        template=st.sampled_from((0, 0, 16, 17, 33)),
        fill=st.sampled_from((0.0, 0.0, 0.5, 0.9, 1.0)),
        fill_rows=st.integers(1, 8),
        seed=st.integers(0, 2**31 - 1),
        generate=st.booleans(),
    )


def _tokens(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, vocab) for _ in range(n))


def _limits(env: ConformanceEnv) -> tuple[int, int]:
    cfg = env.config
    return (cfg.max_batch_tokens, cfg.max_running_requests) if cfg else (2048, 32)


_ATTEMPTS = iter(range(10**9))


def _longest_sample(env: ConformanceEnv) -> int:
    """One token under the checkpoint's context length: a core's data pipeline truncates samples to its max_length,
    the protocol does not say what a host does with a sample it cannot hold, and an engine that samples a token after
    every finished prefill (vLLM) holds the sample plus that token. Longer samples are refused by such a host
    (tests/test_vllm_host.py checks the refusal), so they are not the generated scenarios' concern."""
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(env.model_dir), "max_position_embeddings", 1 << 30)) - 1


def _play(env: ConformanceEnv, sc: Scenario) -> None:
    caps: HostCapabilities = env.host.capabilities()  # type: ignore[attr-defined]
    max_tokens, max_running = _limits(env)
    longest = _longest_sample(env)
    # Ids unique per attempt: hypothesis replays a failing example, and a host a failure left with live requests
    # must not turn the replay into a duplicate-id error that hides the first failure.
    attempt = next(_ATTEMPTS)
    rng = random.Random(sc.seed)
    template = _tokens(rng, sc.template, env.vocab_size)
    ids = rng.sample(range(10**6, 10**7), 64)  # arbitrary, unsorted ids: a host must not rely on their order
    plan = list(sc.injections)
    used = [0]

    def inject(batch: ProposedBatch) -> list[FineTuneSample]:
        if not batch.scheduled or (not caps.mixed_batches and not batch.has_prefill) or not plan:
            return []
        lengths = list(plan.pop(0))
        room = min(caps.max_finetune_tokens_per_step, max_tokens - sum(batch.prefill_lengths) - batch.num_decode)
        # up to 3 rows past the running-request slots: only the token budget is a cap the core keeps
        rows = max(0, max_running - len(batch.scheduled)) + 3
        if sc.fill and len(plan) == len(sc.injections) - 1:
            total = int(room * sc.fill)
            k = max(1, min(sc.fill_rows, total // 2, rows), -(-total // longest))
            lengths = [total // k + (1 if i < total % k else 0) for i in range(k)] if total >= 2 else []
        out: list[FineTuneSample] = []
        for n in lengths:  # the core never injects past the caps: keep the drawn order, drop what does not fit
            n = min(n, longest)
            if n > room or len(out) >= rows or used[0] >= len(ids):
                break
            room -= n
            body = (template + _tokens(rng, n, env.vocab_size))[:n] if template else _tokens(rng, n, env.vocab_size)
            split = rng.randint(1, n - 1)
            out.append(FineTuneSample(ids[used[0]], body, (False,) * split + (True,) * (n - split)))
            used[0] += 1
        return out

    rec = Recorder(inject=inject)
    inv = Invariants(env, rec, caps)
    requests = []
    for i, (n, new_tokens, adapted, at) in enumerate(sc.requests):
        prompt = (template + _tokens(rng, n, env.vocab_size))[:max(n, 1)] if template else _tokens(rng, n, env.vocab_size)
        requests.append((at, ClientRequest(f"gen-{attempt}-{sc.seed}-{i}", prompt, new_tokens,
                                           adapter=env.client_adapter if adapted else None)))
    env.install(rec)
    try:
        steps = 0
        if sc.generate:
            batch = [r for at, r in requests if at <= 0]
            for r in batch:
                inv.submitted[r.request_id] = (r, [_weights_of(env, r.adapter)])
            outputs = env.host.generate(batch) if batch else []  # type: ignore[attr-defined]
            if [o.request_id for o in outputs] != [r.request_id for r in batch]:
                raise inv.fail("driver", f"generate() for {[r.request_id for r in batch]} returned outputs for "
                               f"{[o.request_id for o in outputs]}; expected exactly one per request, in request order")
            inv.take_outputs(outputs)
            steps = 1
        while True:
            due = [r for at, r in requests if at <= steps and r.request_id not in inv.submitted]
            if not due and not env.host.has_unfinished():  # type: ignore[attr-defined]
                due = [r for _, r in requests if r.request_id not in inv.submitted]
                if not due:
                    break
            for r in due:
                env.host.submit(r)  # type: ignore[attr-defined]
                inv.submitted[r.request_id] = (r, [_weights_of(env, r.adapter)])
            inv.take_outputs(env.host.step())  # type: ignore[attr-defined]
            steps += 1
            if steps > 2000:
                raise inv.fail("intercept_schedule", f"{len(requests)} requests did not finish in 2000 steps")
        inv.check_steps()
        inv.check_arrivals()
        missing = sorted(set(inv.submitted) - set(inv.outputs))
        if missing:
            raise inv.fail("intercept_schedule", f"requests {missing} never produced an output")
    finally:
        env.install(None)
        _drain(env)


def _drain(env: ConformanceEnv) -> None:
    for _ in range(5000):
        if not env.host.has_unfinished():  # type: ignore[attr-defined]
            return
        env.host.step()  # type: ignore[attr-defined]


@check("intercept_schedule", broad=True)
def check_generated__scenarios_keep_every_invariant(env: ConformanceEnv) -> None:
    """Generated scenarios (row counts, lengths across KV-block and capture-size boundaries, injection order, a step
    filled to the token budget, staggered arrivals up to the running-request cap) keep every invariant."""
    from hypothesis import example, given
    from hypothesis import seed as hseed

    profile = PROFILES[env.profile]
    _, max_running = _limits(env)
    most = profile.max_requests or max_running + 2

    # Explicit examples run first in every profile: the host's caps are reached even in the fast profile.
    @hseed(env.seed)
    @_settings(env, profile.generated_examples)
    @example(Scenario(requests=tuple((5 + i % 20, 3, bool(i % 2), 0) for i in range(max_running + 2)),
                      injections=((9, 3, 17),), seed=1))
    @example(Scenario(requests=((33, 4, False, 0), (16, 5, True, 0), (70, 2, False, 1)),
                      injections=((40, 2, 17, 5), (16, 33)), template=17, fill=1.0, fill_rows=5, seed=2))
    # more requests than running slots, sent with generate(), rows beside a full step, outputs past 32 tokens
    @example(Scenario(requests=tuple((4 + i % 9, 34 if i % 4 == 0 else 3, i % 3 == 0, 0) for i in range(max_running + 4)),
                      injections=((6, 9, 5), (12,), (7, 7)), seed=3, generate=True))
    @given(_scenarios(most))
    def scenario(sc: Scenario) -> None:
        _play(env, sc)

    try:
        scenario()
    except Exception as exc:  # noqa: BLE001 - hypothesis re-raises the host's own exception types too
        raise _rethrow(env, "generated__scenarios_keep_every_invariant", exc) from exc


# ------------------------------------------------------------------------------------------ stateful


def _machine(env: ConformanceEnv):  # noqa: ANN202, C901 - the machine is one unit, its rules share state
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

    caps: HostCapabilities = env.host.capabilities()  # type: ignore[attr-defined]
    max_tokens, max_running = _limits(env)
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    client_state = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="conformance-stateful")
    runs = iter(range(10**9))

    class HostMachine(RuleBasedStateMachine):
        """One host under interleaved client and DeltaServe operations; invariants after every rule."""

        def __init__(self) -> None:
            super().__init__()
            self.run = next(runs)
            self.rng = random.Random(self.run)
            self.template = _tokens(self.rng, 24, env.vocab_size)
            self.ft_state = env.finetune_state
            self.pending: list[int] = []
            self.ids = iter(range(2_000_000 + 10_000 * self.run, 2_000_000 + 10_000 * (self.run + 1)))
            self.names: dict[str, list[LoraAdapterState]] = {}
            self.latest: str | None = None
            self.requests: dict[str, tuple[ClientRequest, str | None, int]] = {}
            self.rec = Recorder(inject=self._inject)
            self.inv = Invariants(env, self.rec, caps)
            self.count = 0
            env.install(self.rec)

        def _sample(self, n: int, shared: bool) -> FineTuneSample:
            body = (self.template + _tokens(self.rng, n, env.vocab_size))[:n] if shared \
                else _tokens(self.rng, n, env.vocab_size)
            split = self.rng.randint(1, n - 1)
            return FineTuneSample(next(self.ids), body, (False,) * split + (True,) * (n - split))

        def _inject(self, batch: ProposedBatch) -> list[FineTuneSample]:
            self.inv.weights_at_step[batch.step_id] = self.ft_state
            lengths, self.pending = self.pending, []
            if not caps.mixed_batches and batch.scheduled and not batch.has_prefill:
                return []
            room = min(caps.max_finetune_tokens_per_step, max_tokens - sum(batch.prefill_lengths) - batch.num_decode)
            rows = max(0, max_running - len(batch.scheduled)) + 2  # past the slots too: refusals are judged
            out = []
            for i, n in enumerate(lengths):
                if n > room or len(out) >= rows:
                    break
                room -= n
                out.append(self._sample(n, shared=i % 2 == 0))
            return out

        def _unfinished(self) -> bool:
            return bool(env.host.has_unfinished())  # type: ignore[attr-defined]

        def _collect(self, outputs: Sequence[ClientOutput]) -> None:
            # candidates: every version the request's adapter name held from submit to now (one must explain
            # *all* its tokens: a request spanning a publish sees one version only)
            for out in outputs:
                entry = self.requests.get(out.request_id)
                if entry is not None:
                    request, name, first = entry
                    if name is not None and name in self.names:
                        self.inv.submitted[out.request_id] = (request, list(self.names[name][first:]))
            self.inv.take_outputs(outputs)

        @initialize(scale=st.sampled_from((0.5, 1.0, 2.5, -2.0)))
        def start_with_a_published_version(self, scale: float) -> None:
            # so that client rows on a published adapter can meet fine-tuning rows from the first rules on
            _drain(env)
            self.publish(scale)

        @precondition(lambda self: len(self.requests) - len(self.inv.outputs) < 10)
        @rule(n=_lengths(1, 70), new_tokens=st.integers(1, 8), adapter=st.sampled_from(("base", "client", "published")),
              shared=st.booleans())
        def submit(self, n: int, new_tokens: int, adapter: str, shared: bool) -> None:
            prompt = (self.template + _tokens(self.rng, n, env.vocab_size))[:n] if shared \
                else _tokens(self.rng, n, env.vocab_size)
            name = {"base": None, "client": env.client_adapter, "published": self.latest}[adapter]
            self.count += 1
            r = ClientRequest(f"sm-{self.run}-{self.count}", prompt, new_tokens, adapter=name)
            env.host.submit(r)  # type: ignore[attr-defined]
            published = name is not None and name in self.names
            first = len(self.names[name]) - 1 if published else 0
            self.requests[r.request_id] = (r, name if published else None, first)
            self.inv.submitted[r.request_id] = (r, [self.names[name][-1]] if published else [_weights_of(env, name)])

        @precondition(lambda self: not self._unfinished())
        @rule(lengths=st.lists(_lengths(1, 40), min_size=1, max_size=3), new_tokens=st.sampled_from((2, 5, 17, 33)),
              adapter=st.sampled_from(("base", "client", "published")), ft=st.lists(_lengths(2, 30), max_size=2))
        def generate(self, lengths: list[int], new_tokens: int, adapter: str, ft: list[int]) -> None:
            name = {"base": None, "client": env.client_adapter, "published": self.latest}[adapter]
            published = name is not None and name in self.names
            batch = []
            for n in lengths:
                self.count += 1
                r = ClientRequest(f"sm-{self.run}-{self.count}", _tokens(self.rng, n, env.vocab_size), new_tokens,
                                  adapter=name)
                self.requests[r.request_id] = (r, name if published else None,
                                               len(self.names[name]) - 1 if published else 0)
                self.inv.submitted[r.request_id] = (r, [self.names[name][-1]] if published
                                                    else [_weights_of(env, name)])
                batch.append(r)
            self.pending = list(ft)
            outputs = env.host.generate(batch)  # type: ignore[attr-defined]
            if [o.request_id for o in outputs] != [r.request_id for r in batch]:
                raise self.inv.fail("driver", f"generate() for {[r.request_id for r in batch]} returned outputs for "
                                    f"{[o.request_id for o in outputs]}; expected one per request, in request order")
            self._collect(outputs)

        @precondition(lambda self: self._unfinished())
        @rule(lengths=st.lists(_lengths(2, 60), min_size=1, max_size=5))
        def step_with_finetune_rows(self, lengths: list[int]) -> None:
            self.pending = list(lengths)
            self._collect(env.host.step())  # type: ignore[attr-defined]

        @precondition(lambda self: self._unfinished())
        @rule()
        def step(self) -> None:
            self._collect(env.host.step())  # type: ignore[attr-defined]

        @precondition(lambda self: not self._unfinished())
        @rule(lengths=st.lists(_lengths(2, 60), min_size=1, max_size=4),
              abort=st.one_of(st.none(), st.integers(0, max(0, num_layers - 1))))
        def finetune_only_step(self, lengths: list[int], abort: int | None) -> None:
            if abort is not None and not caps.supports_abort:
                abort = None
            self.pending = list(lengths)
            self.rec.abort_after_layer = abort
            before = len(self.rec.batches)
            try:
                env.host.run_idle_step()  # type: ignore[attr-defined]
            finally:
                self.rec.abort_after_layer = None
            if abort is not None:
                for b in self.rec.batches[before:]:
                    if b.step_id in self.rec.injected:
                        self.inv.abort_at[b.step_id] = abort

        # A few per run: each costs an adapter load (a save and an engine load on vLLM), and what matters is that
        # they land between other operations, not how many there are.
        @precondition(lambda self: self.ft_state.version - env.finetune_state.version < 3)
        @rule(scale=st.sampled_from((-1.5, 0.5, 2.0, 3.0)))
        def set_finetune_adapter(self, scale: float) -> None:
            base = env.finetune_state
            self.ft_state = base.with_tensors({k: v * scale for k, v in base.tensors.items()},
                                              version=self.ft_state.version + 1)
            env.host.set_finetune_adapter(handed_copy(self.ft_state))  # type: ignore[attr-defined]

        @precondition(lambda self: sum(len(v) for v in self.names.values()) < 3)
        @rule(scale=st.sampled_from((0.5, 1.0, 2.5, -2.0)))
        def publish(self, scale: float) -> None:
            version = 1000 * (self.run + 1) + sum(len(v) for v in self.names.values())
            state = client_state.with_tensors({k: v * scale for k, v in client_state.tensors.items()}, version=version)
            name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
            self.names.setdefault(name, []).append(state)
            self.latest = name

        @precondition(lambda self: not self._unfinished())
        @rule(prefill=st.lists(_lengths(1, 40), max_size=3), decodes=st.integers(0, 3), context=_lengths(1, 40),
              ft=st.lists(_lengths(2, 30), max_size=2))
        def profile_step(self, prefill: list[int], decodes: int, context: int, ft: list[int]) -> None:
            if not prefill and not decodes and not ft:
                prefill = [8]
            shape = ProfileShape(prefill_lengths=tuple(prefill), num_decode=decodes, decode_context=context,
                                 finetune_lengths=tuple(ft))
            got = env.host.run_profile_step(shape)  # type: ignore[attr-defined]
            self.inv.synthetic_steps.add(got.step_id)
            if not got.synthetic or got not in self.rec.records:
                raise self.inv.fail("run_profile_step", f"expected the profile step's record synthetic and delivered "
                                    f"to the sink; got {got}")
            if self._unfinished():
                raise self.inv.fail("run_profile_step", "after run_profile_step the host has unfinished work: "
                                    "synthetic rows must not stay in the engine")

        @invariant()
        def contract_holds(self) -> None:
            self.inv.check_steps()
            self.inv.check_arrivals()

        def teardown(self) -> None:
            try:
                for _ in range(5000):
                    if not self._unfinished():
                        break
                    self._collect(env.host.step())  # type: ignore[attr-defined]
                self.inv.check_steps()
                missing = sorted(set(self.inv.submitted) - set(self.inv.outputs))
                if missing:
                    raise self.inv.fail("intercept_schedule", f"requests {missing} never produced an output")
            finally:
                env.install(None)
                _drain(env)
                env.host.set_finetune_adapter(handed_copy(env.finetune_state))  # type: ignore[attr-defined]

    return HostMachine


@check("intercept_schedule", broad=True)
def check_stateful__interleaved_operations_keep_every_invariant(env: ConformanceEnv) -> None:
    """Submits, steps with injections, fine-tuning-only steps (with aborts), set_finetune_adapter, publishes and
    profile steps interleaved as the contract allows: every invariant holds after every operation."""
    from hypothesis import seed as hseed
    from hypothesis.stateful import run_state_machine_as_test

    profile = PROFILES[env.profile]
    machine = hseed(env.seed)(_machine(env))
    try:
        run_state_machine_as_test(machine, settings=_settings(env, profile.stateful_examples, profile.stateful_steps))
    except Exception as exc:  # noqa: BLE001
        raise _rethrow(env, "stateful__interleaved_operations_keep_every_invariant", exc) from exc
