"""p20: captures sliced with an inclusive end. Truth: PEFT layer inputs (shape [num_tokens, hidden])."""
from _common import *

S = [sample(1, 10), sample(2, 12)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, S)
    bad = capture_problems(h, sk, S)
    return ran and not bad, f"samples 1 (10 tokens), 2 (12 tokens) in one step (ran={ran}); captures vs PEFT: {bad}"


run("p20", check, host_module("20").Host)
