from common import *
RULE = 'HostHooks.capabilities: "must be cheap and constant for the host\'s lifetime"'
def check(cls):
    h = make(cls); install(h)
    c0 = h.capabilities()
    seen = []
    for i in range(3): h.submit(ClientRequest(f"r{i}", prompt(300, i), 4))
    while h.has_unfinished():
        h.step(); seen.append(h.capabilities())
    diff = [c for c in seen if c != c0]
    return not diff, f"{len(diff)} of {len(seen)} calls differed (e.g. max_finetune_tokens_per_step {[c.max_finetune_tokens_per_step for c in diff][:3]} vs {c0.max_finetune_tokens_per_step})"
run_proof("h32_capabilities_track_free_kv", RULE, check, "blindhosts.h32_capabilities_track_free_kv:Host")
