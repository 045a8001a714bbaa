"""p16: token clock keyed by request id never forgotten. Truth: a request that produced no token has no first token."""
from _common import *


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([req("a", 10, 161, 3)])
    n = len(ic.batches)
    t_submit = time.monotonic()
    h.generate([req("a", 12, 162, 3)])  # the id "a" again, another request
    bad = [(bt.step_id, v.prefill_tokens, v.first_token_time) for bt in batches_of(ic, n) for v in bt.scheduled
           if v.request_id == "a" and (v.prefill_tokens > 0 and v.first_token_time is not None
                                       or v.first_token_time is not None and v.first_token_time < t_submit)]
    return not bad, f"second request 'a' (id reused); (step, prefill_tokens, first_token_time < its submit {t_submit:.3f}): {bad}"


run("p16", check, host_module("16").Host)
