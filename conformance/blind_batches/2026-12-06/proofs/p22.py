"""p22: greedy outputs across KV block boundaries."""
from _common import *  # noqa: F401,F403

H = host_module("22").Host
PR = prompt(10, 31)


def check(cls):
    h = make(cls)
    truth = hf_greedy(PR, 30)
    got = list(h.generate([ClientRequest("a", PR, 30)])[0].token_ids)
    first = next((i for i, (a, b) in enumerate(zip(got, truth)) if a != b), None)
    return got == truth, f"prompt 10 + 30 tokens (positions up to 39): first difference at output {first}; truth {truth}; got {got}"


run("p22", check, H)
