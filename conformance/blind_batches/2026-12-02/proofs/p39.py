from common import *
RULE = ('HostCapabilities: "mixed_batches: one step may hold prefill and decode rows ... S-LoRA never mixes them, so the '
        'core admits fine-tuning only into prefill steps there" (host option mixed_batches=false)')
def check(cls):
    probs = []
    for opts in ({}, {"mixed_batches": "false"}):
        h = make(cls, options=opts); icp, sink, steps = install(h)
        h.submit(ClientRequest("a", prompt(8, 1), 5)); h.step()
        h.submit(ClientRequest("b", prompt(8, 2), 3)); drain(h)
        never_mixed = any(b.has_prefill and b.deferred_decodes for b in icp.batches)
        if h.capabilities().mixed_batches and never_mixed:
            probs.append(f"options {opts}: advertises mixed_batches=True but deferred decodes behind a prefill")
        if not h.capabilities().mixed_batches and not never_mixed:
            probs.append(f"options {opts}: advertises mixed_batches=False but mixed")
    return not probs, "; ".join(probs) or "flag matches behaviour"
run_proof("h39_mixed_flag_from_config_only", RULE, check, "blindhosts.h39_mixed_flag_from_config_only:Host")
