"""p29: on a model with a 70000-token vocabulary, a prompt with ids >= 65536 decodes HF's greedy continuation."""
from _common import *  # noqa: F403

PATH = custom_model("vocab70k", vocab_size=70000)
g = torch.Generator().manual_seed(29)
P = tuple(torch.randint(3, 70000, (16,), generator=g).tolist()[:12]) + (65540, 69001, 66666, 12)
N = 8


def check(cls):
    h = make_at(cls, PATH)
    got = list(h.generate([ClientRequest("a", P, N)])[0].token_ids)
    truth = hf_greedy_at(PATH, P, N)
    high = sum(1 for t in P if t >= 65536)
    return got == truth, f"vocab 70000, prompt of 16 ids ({high} >= 65536), {N} tokens: truth (HF) {truth}; got {got}"


run("p29", check, host_module("29").Host)
