"""p23: ScheduledRequest.output_tokens counts generated tokens only (i at step i of a lone request)."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("a", prompt(8, 1), 4)])
    got = [b.scheduled[0].output_tokens for b in ic.batches]
    return got == [0, 1, 2, 3], f"output_tokens per step {got} (generated so far: [0, 1, 2, 3])"


run("p23", check, host_module("23").Host)
