from common import *
RULE = ('HostHooks.intercept_schedule: "adds the returned samples to that same step"; on_schedule "Returns the samples to add '
        'to *this* step" (1800 inference tokens + 400 FT tokens, under max_finetune_tokens_per_step)')
def check(cls):
    h = make(cls); ss = (sample(1, 200), sample(2, 200))
    icp, sink, steps = install(h, policy=lambda b, k: ss if k == 0 else ())
    assert h.capabilities().max_finetune_tokens_per_step >= 400
    h.submit(ClientRequest("big", prompt(1800, 1), 2))
    drain(h)
    first = icp.batches[0].step_id
    placed = {r.step_id: r.finetune_sample_ids + r.aborted_sample_ids for r in steps.records if r.finetune_sample_ids or r.aborted_sample_ids}
    return placed == {first: (1, 2)}, f"returned for step {first}; ran in {placed}"
run_proof("h29_ft_over_budget_deferred", RULE, check, "blindhosts.h29_ft_over_budget_deferred:Host")
