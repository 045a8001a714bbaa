"""h26: on_schedule is called at most once per step id, even when its samples do not fit."""
import sys
from collections import Counter
import _common as c


def check(cls):
    h = c.make(cls, max_batch_tokens=64)
    n = [0]

    def policy(batch):
        n[0] += 1
        return (c.sample(100 + n[0], 30),) if n[0] <= 2 else ()

    ic, sink, recs = c.install(h, policy=policy)
    h.submit(c.ClientRequest("r0", c.prompt(40), 2))
    c.drain(h)
    counts = Counter(b.step_id for b in ic.batches)
    twice = {k: v for k, v in counts.items() if v > 1}
    if twice:
        return False, f"on_schedule called more than once for steps {twice}"
    return True, f"calls per step {dict(counts)}"


sys.exit(c.verdict(check, "26"))
