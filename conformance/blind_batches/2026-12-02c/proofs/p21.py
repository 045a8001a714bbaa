"""p21: without mixed batches, a prefill step's batch lists the decodes it defers in ``waiting``."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls, mixed_batches=False)
    ic, sk, rec = install(h)
    h.submit(ClientRequest("a", prompt(8, 1), 6))
    h.step()
    h.step()  # "a" is decoding
    h.submit(ClientRequest("b", prompt(6, 2), 2))
    while h.has_unfinished():
        h.step()
    b_prefill = [bt for bt in ic.batches if any(r.request_id == "b" and r.prefill_tokens for r in bt.scheduled)]
    waits = [sorted(r.request_id for r in bt.waiting) for bt in b_prefill]
    ran_a = any(r.request_id == "a" for bt in b_prefill for r in bt.scheduled)
    ok = len(b_prefill) == 1 and not ran_a and "a" in waits[0]
    return ok, f"b's prefill step: waiting={waits}, a scheduled in it: {ran_a}"


run("p21", check, host_module("21").Host)
