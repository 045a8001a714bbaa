"""p19: a request that already has a token and decodes in a step is offered with prefill_tokens 0."""
from _common import *  # noqa: F403

Host = host_module("19").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.submit(req("a", 10, 191, 4))
    drain(h)
    views = [(b.step_id, r.prefill_tokens, r.output_tokens) for b in ic.batches for r in b.scheduled]
    bad = [v for v in views if v[2] > 0 and v[1] != 0]
    return not bad, f"one request, prompt 10, 4 tokens; offered (step, prefill_tokens, output_tokens): {views}"


run("p19", check, Host)
