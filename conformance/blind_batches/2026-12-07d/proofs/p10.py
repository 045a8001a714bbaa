"""p10: in every proposal that schedules request a as a decode, last_token_time is the time of its most recent token
(ClientOutput.token_times[output_tokens - 1]) and first_token_time its first."""
from _common import *


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    out = h.generate([ClientRequest("a", prompt(12, 5), 6)])[0]
    bad = []
    for b in ic.batches:
        for r in b.scheduled:
            if r.request_id == "a" and r.is_decode:
                want = out.token_times[r.output_tokens - 1]
                if r.last_token_time != want or r.first_token_time != out.token_times[0]:
                    bad.append((b.step_id, r.output_tokens, r.last_token_time == out.token_times[0]))
    return not bad, f"6 tokens; (step, output_tokens, last_token_time == first token time) wrong: {bad}"


run("p10", check, host_module("10").Host)
