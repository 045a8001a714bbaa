"""h28: capabilities() is constant over the host's lifetime (idle, with queued and running requests)."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    seen = [h.capabilities()]
    for i in range(3):
        h.submit(c.ClientRequest(f"r{i}", c.prompt(30, i), 3))
    seen.append(h.capabilities())
    h.step()
    seen.append(h.capabilities())
    c.drain(h)
    seen.append(h.capabilities())
    if any(s != seen[0] for s in seen):
        return False, f"max_finetune_tokens_per_step over time: {[s.max_finetune_tokens_per_step for s in seen]}"
    return True, "constant"


sys.exit(c.verdict(check, "28"))
