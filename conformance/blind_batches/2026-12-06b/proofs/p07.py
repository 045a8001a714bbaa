"""p07: five published versions served in one generate() each give PEFT's greedy tokens (h07: 5th adapter no LoRA)."""
from _common import *  # noqa: F403

SEEDS = (7, 8, 9, 10, 11)
N = 6


def check(cls):
    h = make(cls)
    names = [h.publish_adapter(ft_state(seed=s, version=i + 1)) for i, s in enumerate(SEEDS)]
    reqs = [ClientRequest(f"r{i}", prompt(10, 60 + i), N, adapter=n) for i, n in enumerate(names)]
    outs = h.generate(reqs)
    wrong = []
    for i, (s, o) in enumerate(zip(SEEDS, outs)):
        truth = hf_greedy(reqs[i].prompt_ids, N, adapter=adapter_dir("ft", seed=s))
        if list(o.token_ids) != truth:
            base = hf_greedy(reqs[i].prompt_ids, N)
            wrong.append((names[i], list(o.token_ids), truth, "== base" if list(o.token_ids) == base else "!= base"))
    return not wrong, f"published {names}, one request each in one generate(); wrong (name, got, truth PEFT): {wrong}"


run("p07", check, host_module("07").Host)
