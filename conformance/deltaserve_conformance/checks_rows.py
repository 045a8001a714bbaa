"""Checks of what one step holds side by side: adapters of different LoRA ranks, and fine-tuning samples whose tokens
are equal.

Both were missing until blind batch 2026-12-07 went through the suite unseen (its h05: a LoRA kernel run at the rank
of the step's first adapter; its h15: fine-tuning rows keyed by their token ids, so a duplicate example replaces the
other); see docs/conformance.md. They register into :data:`.checks.CHECKS` like the fixed checks there.
"""

from __future__ import annotations

from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.driver import ClientRequest
from deltaserve_core.types import FineTuneSample

from .checks import _fail, _greedy_problems, _inject_into_first_prefill, _reference_layer_inputs, check
from .harness import ConformanceEnv, Recorder, handed_copy, make_prompts, make_samples

__all__: list[str] = []

#: LoRA ranks of the published adapters beside the client adapter (rank 8): one below it, one above; within every
#: host's ``max_lora_rank`` as the suite starts it (16: vLLM and SGLang size their LoRA buffers by it)
_RANKS = (4, 16)
#: their lora_alpha: scalings 0.5 and 1.5, neither a whole number (recipes' alpha = r / 2, alpha 24 at r 16), where
#: every other adapter of the suite scales by 2: integer arithmetic on alpha / r is exact on those alone
_ALPHAS = {4: 2.0, 16: 24.0}


def _adapter_of_rank(env: ConformanceEnv, r: int) -> LoraAdapterState:
    from deltaserve_core.testing.tiny_model import build_lora_adapter

    folder = build_lora_adapter(env.model_dir, env.model_dir.parent / f"published-adapter-rank{r}", seed=20 + r, r=r,
                                lora_alpha=_ALPHAS[r])
    return LoraAdapterState.load_pretrained(folder, name=f"conformance-rank{r}", version=1)


@check("publish_adapter")
def check_publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights(env: ConformanceEnv) -> None:
    """One step serving adapters of different LoRA ranks, the lowest rank first: a published version of rank 4, the
    client adapter (rank 8) and a published version of rank 16, submitted together in that order (and then in the
    opposite order); the rank 4 and 16 adapters scale by 0.5 and 1.5 (``lora_alpha`` not a multiple of ``r``). Each request gets transformers + PEFT's greedy tokens for its own adapter: a batched LoRA kernel
    that takes one rank for the whole step (the first adapter's) cuts the higher-rank adapters' trailing components;
    one that pads to the step's largest rank must pad with zeros."""
    limit = env.config.max_lora_rank if env.config is not None else 16
    weights: dict[str | None, object] = {env.client_adapter: env.client_adapter_dir, None: None}
    order: list[str] = []
    for r in _RANKS:
        if r > limit:
            continue
        state = _adapter_of_rank(env, r)
        name = env.host.publish_adapter(handed_copy(state))  # type: ignore[attr-defined]
        weights[name] = state
        order.append(name)
    order.insert(1, env.client_adapter)
    problems: list[str] = []
    for tag, names in (("ascending", order), ("descending", order[::-1])):
        prompts = make_prompts(env, len(names), seed=95, max_tokens=5, adapter_every=0, prefix=f"ranks-{tag}")
        requests = [ClientRequest(r.request_id, r.prompt_ids, r.max_tokens, adapter=name)
                    for r, name in zip(prompts, names)]
        problems += _greedy_problems(env, env.run(requests), requests, lambda q: weights[q.adapter])
    if problems:
        ranks = {n: (weights[n].config.r if isinstance(weights[n], LoraAdapterState) else 8) for n in order}
        raise _fail(env, "publish_adapter", f"adapters of ranks {[ranks[n] for n in order]} ({order}), one request "
                    "each, submitted together in rising and then falling order of rank: expected each request's "
                    "transformers+PEFT greedy outputs for its own adapter; " + "; ".join(problems[:3]))


@check("intercept_schedule")
def check_intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused(env: ConformanceEnv) -> None:
    """Fine-tuning samples with equal ``input_ids`` under different sample ids (a dataset's duplicate example, or one
    example at two epochs), returned together for one step, are separate rows: each is run whole in that step (in its
    record's ``finetune_sample_ids``, captured at every layer as transformers + PEFT computes it) or refused in that
    step's record, never lost. A host that keys its fine-tuning rows (engine requests) by their tokens runs one of
    them and reports nothing of the other."""
    first, other, third = make_samples(env, 3, lengths=[12, 9, 12], seed=97, first_id=2400)
    twin = FineTuneSample(third.sample_id, first.input_ids, first.loss_mask, epoch=1)
    samples = [first, other, twin]
    rec = Recorder(inject=_inject_into_first_prefill(samples))
    env.install(rec)
    env.run(make_prompts(env, 2, seed=97, max_tokens=2))
    if not rec.injected:
        raise _fail(env, "intercept_schedule", "no step with prefill was offered to on_schedule")
    (step_id, _), = rec.injected.items()
    want = sorted(s.sample_id for s in samples)
    placed = {r.step_id: sorted(set(r.finetune_sample_ids) | set(r.aborted_sample_ids)) for r in rec.real_records()
              if (set(r.finetune_sample_ids) | set(r.aborted_sample_ids)) & set(want)}
    setting = (f"samples {want} were returned for step {step_id}, {first.sample_id} and {twin.sample_id} with the same "
               f"{first.num_tokens} input_ids (epochs 0 and 1)")
    if placed != {step_id: want}:
        raise _fail(env, "intercept_schedule", f"{setting}; the records place them as {placed}: expected each run in "
                    "that step or refused there (aborted_sample_ids), never dropped, whatever tokens it shares")
    record = next(r for r in rec.real_records() if r.step_id == step_id)
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    for s in samples:
        if s.sample_id not in record.finetune_sample_ids:
            continue
        got = {layer: t for _, layer, sid, t in rec.captures if sid == s.sample_id}
        missing = sorted(set(range(num_layers)) - set(got))
        if missing:
            raise _fail(env, "intercept_schedule", f"{setting}; sample {s.sample_id} is in the record's "
                        f"finetune_sample_ids but no input was captured for its layers {missing}: expected it run whole")
        ref = _reference_layer_inputs(env, s.input_ids)
        for layer in range(num_layers):
            t = got[layer]
            bound = env.tolerance * (1.0 + ref[layer].abs().max().item())
            if tuple(t.shape) != tuple(ref[layer].shape) or (t - ref[layer]).abs().max().item() > bound:
                raise _fail(env, "intercept_schedule", f"{setting}; sample {s.sample_id}'s layer-{layer} input "
                            f"(shape {tuple(t.shape)}) is not transformers+PEFT's for its tokens (shape "
                            f"{tuple(ref[layer].shape)}): expected each sample run as its own row")
