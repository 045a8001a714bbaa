"""p06: two fine-tuning samples in one fine-tuning-only step: every layer input equals the PEFT model's (reserved
adapter = the state given to set_finetune_adapter)."""
from _common import *

samples = [sample(1, 10), sample(2, 12)]


def check(cls):
    h, ic, sk, rec, ran = idle_capture(cls, samples)
    bad = capture_problems(h, sk, samples)
    return ran and not bad, f"samples 1 (10 tokens), 2 (12 tokens) in one step (ran={ran}); captures vs PEFT: {bad}"


run("p06", check, host_module("06").Host)
