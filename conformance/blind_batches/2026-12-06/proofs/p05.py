"""p05: on_schedule exactly once per executed step, also for a step near the token budget."""
from _common import *  # noqa: F401,F403

H = host_module("05").Host
REQS = [req(f"r{i}", 505, 50 + i, 2) for i in range(4)]


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate(REQS)
    offered = [b.step_id for b in ic.batches]
    ran = [r.step_id for r in rec.records]
    return (offered == ran and len(ran) == 2,
            f"4 prompts of 505 tokens (2020 of max_batch_tokens 2048 in step 0): steps run {ran}, offered to "
            f"on_schedule {offered}")


run("p05", check, H)
