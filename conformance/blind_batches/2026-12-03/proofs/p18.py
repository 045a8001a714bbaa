"""p18: on a host without mixed batches, records count the decodes that ran: a prefill step has none, and in all
the records count (max_tokens - 1) decodes per request, with KV lengths prompt + tokens so far (arithmetic)."""
from _common import ClientRequest, drain, host_module, install, make, prompt, run

REQS = [ClientRequest("a", prompt(6, 1), 6), ClientRequest("b", prompt(5, 2), 4)]
DECODES = sum(r.max_tokens - 1 for r in REQS)
KV = sum(len(r.prompt_ids) + k for r in REQS for k in range(r.max_tokens - 1))


def check(cls):
    h = make(cls, mixed_batches=False)
    ic, sk, rec = install(h)
    h.submit(REQS[0]); h.step(); h.step()
    h.submit(REQS[1])
    drain(h)
    dec = sum(r.num_decode for r in rec.records)
    kv = sum(r.kv_tokens for r in rec.records)
    mixed = [r.step_id for r in rec.records if r.prefill_lengths and r.num_decode]
    ok = dec == DECODES and kv == KV and not mixed
    return ok, f"decodes {dec} (truth {DECODES}), kv_tokens {kv} (truth {KV}), prefill steps with decodes {mixed}"


run("p18", check, host_module("18").Host)
