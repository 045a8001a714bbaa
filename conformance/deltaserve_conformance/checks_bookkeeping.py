"""Checks of declared facts and step bookkeeping: what a host says about its model and budget against the checkpoint
and its config, step ids over a host's lifetime, the two halves of a ProposedBatch, token times against the steps
that produced them, ``run_idle_step``'s answer, EOS handling and the forward's determinism under LoRA dropout.

Each was missing until a blind batch of broken hosts (2026-12-03) went through the suite unseen; they register into
:data:`.checks.CHECKS` like the fixed checks there.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientRequest
from deltaserve_core.types import ProfileShape

from .checks import _capture_problems, _context_length, _fail, _inject_into_first_prefill, _token_times_and_steps, check
from .harness import ConformanceEnv, Recorder, handed_copy, make_prompts, make_samples

__all__: list[str] = []


def _staggered_run(env: ConformanceEnv, rec: Recorder, seed: int, *, max_tokens: int = 6) -> list[ClientRequest]:
    """Two requests, then two more arriving while the first decode: batches with prefills, decodes and (on hosts
    that defer) waiting requests."""
    first = make_prompts(env, 2, seed=seed, max_tokens=max_tokens)
    later = make_prompts(env, 2, seed=seed + 1, max_tokens=max_tokens, prefix="later")
    env.install(rec)
    for r in first:
        env.host.submit(r)  # type: ignore[attr-defined]
    for _ in range(2):
        env.host.step()  # type: ignore[attr-defined]
    env.run_stepwise(later)
    return first + later


@check("intercept_schedule")
def check_intercept_schedule__scheduled_and_waiting_are_disjoint(env: ConformanceEnv) -> None:
    """A request is in at most one half of an offered batch: a decode that runs in this step is in ``scheduled``,
    never also in ``waiting`` (the core prices a waiting request's TPOT clock against the step; listed twice, it
    counts a running decode as one kept waiting)."""
    rec = Recorder()
    _staggered_run(env, rec, seed=47)
    for b in rec.batches:
        both = sorted({r.request_id for r in b.scheduled} & {r.request_id for r in b.waiting})
        if both:
            raise _fail(env, "intercept_schedule", f"step {b.step_id} lists {both} both in scheduled and in waiting "
                        f"(scheduled: {sorted(r.request_id for r in b.scheduled)}, waiting: "
                        f"{sorted(r.request_id for r in b.waiting)}); expected each request in one of them")


@check("report_step_time")
def check_report_step_time__step_ids_never_repeat(env: ConformanceEnv) -> None:
    """Step ids come from one increasing sequence for the host's lifetime: calibration (profile) steps and served
    steps never share one, and a step offered after another has a larger id. A profile path counting its own steps
    from 0 hands served steps ids the calibration already used, and the core then pairs records, captures and
    admissions of different steps."""
    rec = Recorder()
    env.install(rec)
    env.run(make_prompts(env, 1, seed=48, max_tokens=3))
    served_before = max((b.step_id for b in rec.batches), default=-1)
    returned = [env.host.run_profile_step(shape)  # type: ignore[attr-defined]
                for shape in (ProfileShape(prefill_lengths=(9,)), ProfileShape(num_decode=2, decode_context=8))]
    offered = len(rec.batches)
    env.run(make_prompts(env, 1, seed=49, max_tokens=3))
    served_after = min((b.step_id for b in rec.batches[offered:]), default=None)
    order = [served_before] + [r.step_id for r in returned] + ([served_after] if served_after is not None else [])
    if any(b <= a for a, b in zip(order, order[1:])):
        raise _fail(env, "report_step_time", f"step ids went {order} (the last served step before calibration, "
                    f"{len(returned)} profile steps, the first served step after): expected one increasing sequence, "
                    "calibration steps included")
    # Two different steps under one id; the same record delivered twice is one_record_per_step's to judge.
    seen: dict[int, object] = {}
    for r in rec.records:
        if r.step_id in seen and seen[r.step_id] != r:
            raise _fail(env, "report_step_time", f"step id {r.step_id} names two different steps: {seen[r.step_id]} "
                        f"and {r}; expected every step to carry an id no other step had")
        seen.setdefault(r.step_id, r)


@check("driver")
def check_driver__run_idle_step_answers_whether_a_step_ran(env: ConformanceEnv) -> None:
    """``run_idle_step()`` returns True exactly when a step executed (its record reaches the step sink): False when
    the interceptor added nothing to the empty step, True when it added rows and they ran. The core's idle loop
    reads the answer to decide whether the engine has time left; True for nothing makes it spin."""
    rec = Recorder(inject=lambda batch: ())
    env.install(rec)
    before = len(rec.records)
    declined = env.host.run_idle_step()  # type: ignore[attr-defined]
    if declined or len(rec.records) != before:
        raise _fail(env, "driver", f"run_idle_step() with an interceptor that added nothing returned {declined!r} "
                    f"and {len(rec.records) - before} record(s) arrived; expected False and no record (no step ran)")
    samples = make_samples(env, 1, first_id=4700, lengths=[8], seed=147)
    rec.inject = lambda batch: samples if batch.is_empty else ()
    ran = env.host.run_idle_step()  # type: ignore[attr-defined]
    carried = [r for r in rec.records[before:] if set(r.finetune_sample_ids) | set(r.aborted_sample_ids)]
    if not ran or not carried:
        raise _fail(env, "driver", f"run_idle_step() with a fine-tuning row injected returned {ran!r}, records with "
                    f"the row: {len(carried)}; expected True and the step's record")


@check("driver")
def check_driver__has_unfinished_true_when_the_finishing_steps_record_arrives(env: ConformanceEnv) -> None:
    """A step record delivered before ``step()`` has returned the output of the request that finished in that step
    finds ``has_unfinished()`` True: the request is unfinished until its output is returned, and the core's step sink
    reads request state right there. An engine that frees finished requests before it hands the record over answers
    False for a request whose output nobody has received. Judged for records delivered on the thread that called
    ``step()`` (hosts with their own engine thread may deliver later, legitimately)."""
    import threading

    rec = Recorder()
    env.install(rec)
    driving = threading.get_ident()
    returned = False
    answers: list[tuple[int, bool]] = []

    def sink(record) -> None:  # noqa: ANN001
        if threading.get_ident() == driving and not returned:
            answers.append((record.step_id, env.host.has_unfinished()))  # type: ignore[attr-defined]

    env.host.report_step_time(sink)  # type: ignore[attr-defined]
    request = make_prompts(env, 1, seed=154, max_tokens=3, adapter_every=0, prefix="finish-record")[0]
    env.host.submit(request)  # type: ignore[attr-defined]
    for _ in range(10_000):
        if any(o.request_id == request.request_id for o in env.host.step()):  # type: ignore[attr-defined]
            returned = True
            break
    else:
        raise _fail(env, "driver", f"{request.request_id} was not returned by step() within 10000 steps")
    false_at = [step for step, unfinished in answers if not unfinished]
    if false_at:
        raise _fail(env, "driver", f"has_unfinished() answered False when the records of steps {false_at} arrived, "
                    f"before step() had returned {request.request_id!r}'s output; expected True until the output is "
                    "returned (the core's step sink decides on it)")


def _checkpoint_config(path: Path) -> dict | None:
    cfg = path / "config.json"
    return json.loads(cfg.read_text()) if cfg.is_file() else None


@check("model_spec")
def check_model_spec__matches_the_checkpoint(env: ConformanceEnv) -> None:
    """``model_spec()`` describes the checkpoint the host serves, as its ``config.json`` says: ``path`` a local
    folder holding it (the backward process loads the base from there), ``num_layers``, ``hidden_size`` and
    ``vocab_size`` that config's own values (an engine's padded vocabulary, e.g. rounded up to a multiple of 64, is
    the engine's layout, not the model's: the backward's output head has the checkpoint's size), and
    ``layer_module`` the decoder-layer list of the transformers model of that folder (not the engine's module path,
    which wraps the model once more)."""
    spec = env.host.model_spec()  # type: ignore[attr-defined]
    folder = Path(spec.path)
    if not folder.is_dir():
        raise _fail(env, "model_spec", f"ModelSpec.path={spec.path!r} is not a local folder (the host was started "
                    f"from {str(env.model_dir)!r}); expected the checkpoint folder the backward process loads")
    cfg = _checkpoint_config(folder)
    if cfg is None:
        raise _fail(env, "model_spec", f"ModelSpec.path={spec.path!r} holds no config.json; expected a transformers "
                    "checkpoint folder")
    truth = _checkpoint_config(env.model_dir) or cfg
    wrong = {name: (got, truth.get(key)) for name, key, got in (
        ("num_layers", "num_hidden_layers", spec.num_layers), ("hidden_size", "hidden_size", spec.hidden_size),
        ("vocab_size", "vocab_size", spec.vocab_size)) if truth.get(key) is not None and got != truth.get(key)}
    if wrong:
        raise _fail(env, "model_spec", "ModelSpec differs from the checkpoint's config.json: " + ", ".join(
            f"{k} {g} (config.json: {t})" for k, (g, t) in wrong.items()) + "; expected the checkpoint's own values")
    layers = _layer_list(folder, spec.layer_module)
    if isinstance(layers, str):
        raise _fail(env, "model_spec", f"ModelSpec.layer_module={spec.layer_module!r} {layers}; expected the dotted "
                    "path of the decoder-layer list in the transformers model the backward process loads (an "
                    "engine's own module path is not that)")
    if layers != truth.get("num_hidden_layers", layers):
        raise _fail(env, "model_spec", f"ModelSpec.layer_module={spec.layer_module!r} names a list of {layers} "
                    f"modules in the transformers model, but config.json has {truth.get('num_hidden_layers')} layers; "
                    "expected the decoder-layer list")


def _layer_list(folder: Path, dotted: str) -> int | str:
    """Length of the module list at ``dotted`` in the transformers model of ``folder`` (built on the meta device: no
    weights are read), or why it is not one."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    node = model
    for i, part in enumerate(dotted.split(".")):
        if not hasattr(node, part):
            return f"does not resolve on {type(model).__name__}: it has no {'.'.join(dotted.split('.')[:i + 1])!r}"
        node = getattr(node, part)
    if not isinstance(node, torch.nn.ModuleList):
        return f"resolves to a {type(node).__name__} on {type(model).__name__}, not a module list"
    return len(node)


@check("capabilities")
def check_capabilities__finetune_budget_is_the_step_budget(env: ConformanceEnv) -> None:
    """``max_finetune_tokens_per_step`` is the host's per-step token budget, minus nothing else: for a host
    started from a HostConfig, its ``max_batch_tokens``. The core already subtracts the client rows of each step;
    a host that also reserves room (e.g. one token per running request) shrinks every fine-tuning-only step."""
    if env.config is None:
        return  # a host not started from a HostConfig: no budget to compare with (the suite always has one)
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    if caps.max_finetune_tokens_per_step != env.config.max_batch_tokens:
        raise _fail(env, "capabilities", f"max_finetune_tokens_per_step={caps.max_finetune_tokens_per_step}, but the "
                    f"host was started with max_batch_tokens={env.config.max_batch_tokens}; expected the step's whole "
                    "budget (the core leaves room for the client rows itself)")


@check("intercept_schedule")
def check_intercept_schedule__token_times_not_before_their_step(env: ConformanceEnv) -> None:
    """A request's token times (ScheduledRequest.first_token_time / last_token_time) are when the token existed:
    never before the forward of the step that produced it began (its StepRecord.start_time). A time stamped when the
    step was scheduled makes the core's TPOT clock run short by a whole step."""
    rec = Recorder()
    requests = _staggered_run(env, rec, seed=49)
    starts = {r.step_id: r.start_time for r in rec.real_records()}
    times, producing = _token_times_and_steps(rec, requests)
    for b in rec.batches:  # the first token's time as every offer shows it, also after later tokens came
        for r in b.waiting + b.scheduled:
            if r.first_token_time is not None:
                times.setdefault((r.request_id, 1), r.first_token_time)
    compared = 0
    for (rid, k), t in sorted(times.items()):
        steps = producing.get(rid, [])
        if k > len(steps) or steps[k - 1] not in starts:
            continue
        step = steps[k - 1]
        compared += 1
        if t < starts[step] - 1e-6:  # time.monotonic() is one clock for every process of a machine
            raise _fail(env, "intercept_schedule", f"token {k} of {rid!r} is timed {(starts[step] - t) * 1e3:.3f} ms "
                        f"before step {step}, which produced it, began (start_time {starts[step]:.6f}, token time "
                        f"{t:.6f}); expected the time the token existed")
    if not compared:
        raise _fail(env, "intercept_schedule", "no token time could be paired with the step that produced it (no "
                    "ScheduledRequest carried token times, or no record arrived for the producing steps)")


def _eos_ids(env: ConformanceEnv) -> list[int]:
    """Every EOS id of the checkpoint, generation_config.json's and config.json's (a list in many checkpoints)."""
    ids: list[int] = []
    gen = env.model_dir / "generation_config.json"
    for cfg in (json.loads(gen.read_text()) if gen.is_file() else None, _checkpoint_config(env.model_dir)):
        eos = (cfg or {}).get("eos_token_id")
        for t in eos if isinstance(eos, list) else [eos]:
            if isinstance(t, int) and t not in ids:
                ids.append(t)
    return ids


@check("driver")
def check_driver__ignore_eos_false_stops_at_the_first_eos(env: ConformanceEnv) -> None:
    """A request with ``ignore_eos=False`` stops at the first EOS it generates, EOS included as its last token (and
    timed like every other token); the same prompt with ``ignore_eos=True`` runs on to ``max_tokens``. The prompt is
    found by running candidates with ``ignore_eos=True`` and taking one whose greedy continuation holds EOS early. Every
    id of a list-valued ``eos_token_id`` is an EOS: the re-run on the deep checkpoint, whose list has three ids after
    the tokenizer's, meets a later one (blind batch 2026-12-07c, h10: only the list's first id stopped a request)."""
    eos = _eos_ids(env)
    if not eos:
        raise _fail(env, "driver", f"the checkpoint {env.model_dir} names no eos_token_id")
    found: tuple[ClientRequest, tuple[int, ...], int] | None = None
    for salt in range(4):
        probes = make_prompts(env, 16, seed=50, max_tokens=24, adapter_every=0, prefix="eos-probe", token_salt=salt)
        for r, out in zip(probes, env.run(probes)):
            at = next((i for i, t in enumerate(out.token_ids[:-1]) if t in eos), None)
            if at is not None:
                found = (r, out.token_ids, at)
                break
        if found:
            break
    if found is None:
        raise _fail(env, "driver", f"none of 64 greedy continuations (24 tokens, ignore_eos=True) held an EOS id of "
                    f"{eos}; a host that never samples EOS under greedy decoding differs from the model")
    probe, tokens, at = found
    again = ClientRequest("eos-stop", probe.prompt_ids, probe.max_tokens, ignore_eos=False)
    out = env.run([again])[0]
    got = out.token_ids
    if got != tokens[:at + 1]:
        raise _fail(env, "driver", f"with ignore_eos=False the request got {len(got)} tokens {list(got)[:at + 4]}; "
                    f"its greedy continuation has EOS {tokens[at]} (of the checkpoint's EOS ids {eos}) at position "
                    f"{at}, so expected the {at + 1} tokens {list(tokens[:at + 1])} (stop at the first EOS, EOS "
                    "included)")
    # A stop token is often stamped nowhere (engines stamp times where text is emitted, and EOS emits none).
    times = out.token_times
    if times and (len(times) != len(got) or times[-1] != out.finish_time):
        raise _fail(env, "driver", f"the output that stopped at EOS has {len(got)} tokens but {len(times)} "
                    f"token_times, the last {times[-1]} against finish_time {out.finish_time}; expected one time per "
                    "token, the EOS token's included, the last equal to finish_time")


@check("driver")
def check_driver__a_prompt_of_the_whole_step_budget_is_served(env: ConformanceEnv) -> None:
    """A request the host accepted is never lost nor cut short: a prompt as long as a whole step's token budget (or,
    where the checkpoint's context is shorter, as long as the context allows) is scheduled and served in full, its
    tokens the model's greedy ones. Clients truncating to the engine's limit send exactly such prompts. A host may
    refuse a prompt at the very edge in ``submit`` (engines keep a few positions back); the check then steps down, a
    token at a time, to the longest prompt the host accepts. A host that accepts it and returns fewer tokens fails:
    SGLang caps ``max_new_tokens`` two positions short of its context silently, as blind batch 2026-12-07c's h11
    does past the context. Blind batch 2026-12-07b, h15: a scheduler whose fit test is strict (``<``) where submit's is ``<=`` accepts it and never schedules it; the suite's
    checkpoint has a shorter context than the default budget, so the re-run on the deep checkpoint (4096 positions)
    is the one that reaches the budget."""
    budget = env.config.max_batch_tokens if env.config is not None else 2048
    max_tokens = 2
    context = _context_length(env)
    longest = min(budget, context - max_tokens)
    for length in range(longest, longest - 16, -1):
        request = make_prompts(env, 1, seed=57, max_tokens=max_tokens, adapter_every=0,
                               prefix=f"whole-budget-{length}", length_range=(length, length))[0]
        try:
            env.host.submit(request)  # type: ignore[attr-defined]
            break
        except ValueError:
            continue
    else:
        raise _fail(env, "driver", f"submit() refused every prompt of {longest - 15} to {longest} tokens with "
                    f"max_tokens={max_tokens} (max_batch_tokens={budget}, context {context}): a host "
                    "serves prompts up to its budget, keeping at most a few positions back")
    try:
        outputs = env.run_stepwise([], max_steps=200)
    except AssertionError:
        raise _fail(env, "driver", f"a prompt of {length} tokens (max_batch_tokens={budget}) was accepted by "
                    "submit() and not finished after 200 steps: a prompt that fits the budget exactly must be "
                    "scheduled (is the scheduler's fit test strict where submit's is not?)") from None
    mine = [o for o in outputs if o.request_id == request.request_id]
    if len(mine) != 1 or len(mine[0].token_ids) != max_tokens:
        raise _fail(env, "driver", f"a prompt of {length} tokens (max_batch_tokens={budget}) with max_tokens="
                    f"{max_tokens} came back as {[list(o.token_ids) for o in mine]}; expected one output of "
                    f"{max_tokens} tokens (a request the host cannot serve in full is refused by submit(), never "
                    "cut short)")
    wrong = env.independent.greedy_mismatch(None, request.prompt_ids, mine[0].token_ids)
    if wrong is not None:
        raise _fail(env, "driver", f"a prompt of {length} tokens (the whole step budget) decoded wrongly: "
                    f"{wrong.describe()}")
    # Past the context: a prompt that fits the step budget but whose max_tokens run past the checkpoint's positions
    # is refused by submit() or served in full; an engine that stops it at its length limit and reports it finished
    # cuts a client's answer short without a word (blind batch 2026-12-07c, h11).
    over = min(budget, context - 1)
    if over + max_tokens > context:
        late = make_prompts(env, 1, seed=58, max_tokens=max_tokens, adapter_every=0, prefix="past-context",
                            length_range=(over, over))[0]
        try:
            env.host.submit(late)  # type: ignore[attr-defined]
        except ValueError:
            return
        got = [o for o in env.run_stepwise([], max_steps=200) if o.request_id == late.request_id]
        if len(got) != 1 or len(got[0].token_ids) != max_tokens:
            raise _fail(env, "driver", f"a prompt of {over} tokens with max_tokens={max_tokens} (past the "
                        f"checkpoint's {context} positions) was accepted by submit() and came back as "
                        f"{[len(o.token_ids) for o in got]} token(s); expected submit() to refuse it (ValueError "
                        f"naming the limit) or {max_tokens} tokens, never an answer cut short")


@check("set_finetune_adapter")
def check_set_finetune_adapter__lora_dropout_never_reaches_the_forward(env: ConformanceEnv) -> None:
    """An adapter whose config has ``lora_dropout`` > 0 (as a training job's usually does) still runs exactly its
    weights: the serving and capturing forward is deterministic, dropout belongs to training. Captures of the same
    sample in two steps are equal and equal the reference forward."""
    original = env.finetune_state
    state = LoraAdapterState(original.name, original.version + 7,
                             dataclasses.replace(original.config, lora_dropout=0.5), dict(original.tensors),
                             original.base_model_path)
    env.host.set_finetune_adapter(handed_copy(state))  # type: ignore[attr-defined]
    try:
        for round_ in range(2):
            samples = make_samples(env, 2, lengths=[10, 17], seed=151, first_id=4800 + 10 * round_)
            rec = Recorder(inject=_inject_into_first_prefill(samples))
            try:
                env.install(rec)
                env.run(make_prompts(env, 2, seed=151 + round_))
            finally:
                env.install(None)
            problems = _capture_problems(env, rec, samples, state)
            if problems:
                raise _fail(env, "set_finetune_adapter", f"with lora_dropout={state.config.lora_dropout} in the "
                            f"adapter's config (round {round_ + 1} of 2), captures differ from the deterministic "
                            "forward of exactly these weights: " + "; ".join(problems[:3]))
    finally:
        env.host.set_finetune_adapter(handed_copy(original))  # type: ignore[attr-defined]


@check("report_step_time")
def check_report_step_time__record_has_the_composition_that_ran(env: ConformanceEnv) -> None:
    """A step's record reports the client rows the step ran, as its offer scheduled them: the prefill lengths, the
    decode count and those decodes' KV tokens. On a host without mixed batches a prefill step runs no decode: the
    decodes it defers are waiting, not in its record (counted there, calibration fits prefill steps as mixed ones)."""
    rec = Recorder()
    _staggered_run(env, rec, seed=53)
    offered = {b.step_id: b for b in rec.batches}  # the last offer of a step is the batch it ran
    compared = 0
    for r in rec.real_records():
        b = offered.get(r.step_id)
        if b is None or b.is_empty:
            continue
        compared += 1
        want = (tuple(sorted(b.prefill_lengths)), b.num_decode, b.kv_tokens)
        got = (tuple(sorted(r.prefill_lengths)), r.num_decode, r.kv_tokens)
        if got != want:
            raise _fail(env, "report_step_time", f"step {r.step_id}'s record reports prefills {got[0]}, {got[1]} "
                        f"decodes over {got[2]} KV tokens; the step ran (its offer's scheduled rows) prefills "
                        f"{want[0]}, {want[1]} decodes over {want[2]} KV tokens (waiting: "
                        f"{sorted(w.request_id for w in b.waiting)}); expected the composition that ran")
    if not compared:
        raise _fail(env, "report_step_time", "no record of a step with client rows arrived")


@check("capabilities")
def check_capabilities__declared_mixed_batches_run_rows_in_decode_steps(env: ConformanceEnv) -> None:
    """A host that declares ``mixed_batches`` runs fine-tuning rows the core injects into a decode-only step, in
    that step: that is how the core fills decode steps on such hosts. A declaration left at True on a host started
    without mixed batches makes every such injection fail or vanish."""
    caps = env.host.capabilities()  # type: ignore[attr-defined]
    if not caps.mixed_batches:
        return  # the core injects into prefill steps only (HostCapabilities: an obligation of the core)
    samples = make_samples(env, 1, first_id=5300, lengths=[9], seed=153)
    fired: list[int] = []

    def inject(batch):  # noqa: ANN001, ANN202
        if not fired and batch.scheduled and not batch.has_prefill:
            fired.append(batch.step_id)
            return samples
        return ()

    rec = Recorder(inject=inject)
    env.install(rec)
    try:
        env.run(make_prompts(env, 2, seed=153, max_tokens=4))
    except Exception as exc:  # noqa: BLE001 - the host's own refusal is the finding
        raise _fail(env, "capabilities", f"mixed_batches=True, but a fine-tuning row injected into a decode-only "
                    f"step made the step fail: {type(exc).__name__}: {exc}") from exc
    if not fired:
        raise _fail(env, "capabilities", "mixed_batches=True, but no decode-only step was offered for 2 requests of 4 "
                    "tokens")
    record = rec.record_for(fired[0])
    ran = set(record.finetune_sample_ids) if record is not None else set()
    if ran != {5300}:
        raise _fail(env, "capabilities", f"mixed_batches=True, but the fine-tuning row injected into decode-only "
                    f"step {fired[0]} did not run there (its record: {record}); expected it in that step")
