"""p02: decode positions from the batch's longest context. Truth: HF greedy decoding per request."""
from _common import *

A, B = req("a", 12, 21, 8), req("b", 20, 22, 8)
TRUTH = {r.request_id: hf_greedy(r.prompt_ids, r.max_tokens) for r in (A, B)}


def check(cls):
    h = make(cls)
    outs = h.generate([A, B])
    wrong = [(o.request_id, list(o.token_ids), TRUTH[o.request_id]) for o in outs if list(o.token_ids) != TRUTH[o.request_id]]
    return not wrong and len(outs) == 2, f"a (prompt 12) and b (prompt 20) decoding together; wrong (id, got, truth HF): {wrong}"


run("p02", check, host_module("02").Host)
