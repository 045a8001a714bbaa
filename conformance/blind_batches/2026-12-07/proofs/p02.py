"""p02: a request decoding in a step that also prefills a new prompt must keep HF's greedy tokens."""
from _common import *  # noqa: F403

Host = host_module("02").Host
A, B = req("a", 12, 21, 10), req("b", 9, 22, 6)
TRUTH = {"a": hf_greedy(A.prompt_ids, 10), "b": hf_greedy(B.prompt_ids, 6)}


def check(cls):
    h = make(cls)
    h.submit(A)
    outs = h.step() + h.step()
    h.submit(B)  # a decodes while b's prompt is prefilled
    outs += drain(h)
    got = {o.request_id: list(o.token_ids) for o in outs}
    bad = [(k, got.get(k), TRUTH[k]) for k in TRUTH if got.get(k) != TRUTH[k]]
    return not bad, f"a (prompt 12) decoding when b (prompt 9) arrives at step 2; wrong (id, got, truth HF): {bad}"


run("p02", check, Host)
