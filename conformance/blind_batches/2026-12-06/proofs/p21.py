"""p21: ignore_eos=True (default) runs on to max_tokens past an EOS."""
from _common import *  # noqa: F401,F403

H = host_module("21").Host
PR = prompt(8, 23)  # greedy continuation reaches EOS (token 2) as its 11th token


def check(cls):
    h = make(cls)
    truth = hf_greedy(PR, 14)
    got = list(h.generate([ClientRequest("a", PR, 14)])[0].token_ids)
    eos = truth.index(2) if 2 in truth else None
    return (got == truth and eos is not None,
            f"ignore_eos default (True), max_tokens 14: truth (HF greedy, EOS at index {eos}) {truth}; got {got}")


run("p21", check, H)
