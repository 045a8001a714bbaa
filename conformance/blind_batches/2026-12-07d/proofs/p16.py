"""p16: a and b (12-token prompts, 3 tokens) submitted together finish in the same step (step 0 prefills both, steps
1-2 decode both): the third step() returns both."""
from _common import *


def check(cls):
    h = make(cls)
    h.submit(ClientRequest("a", prompt(12, 5), 3))
    h.submit(ClientRequest("b", prompt(12, 6), 3))
    calls = step_calls(h)
    ok = len(calls) == 3 and sorted(calls[2]) == ["a", "b"] and not calls[0] and not calls[1]
    return ok, f"ids returned per step() call: {calls}"


run("p16", check, host_module("16").Host)
