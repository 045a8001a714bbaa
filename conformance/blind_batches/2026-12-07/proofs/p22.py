"""p22: a request with no token yet is offered with last_token_time None."""
from _common import *  # noqa: F403

Host = host_module("22").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.submit(req("a", 10, 221, 3))
    h.submit(req("b", 2045, 222, 2))  # waits: over the budget left in step 0 (2038)
    drain(h)
    views = [(b.step_id, r.request_id, r.output_tokens, r.first_token_time is None, r.last_token_time)
             for b in ic.batches for r in b.scheduled + b.waiting]
    bad = [v for v in views if v[2] == 0 and v[4] is not None]
    return not bad, f"views with no token and a last_token_time (step, id, output_tokens, first None, last): {bad[:4]}"


run("p22", check, Host)
