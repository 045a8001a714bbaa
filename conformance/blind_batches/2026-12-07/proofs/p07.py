"""p07: a published version (r 8, lora_alpha 16) must serve PEFT's outputs of that adapter."""
from _common import *  # noqa: F403

Host = host_module("07").Host
FT = adapter_dir("ft", seed=FT_ADAPTER_SEED)
A = req("a", 14, 71, 10)
TRUTH = hf_greedy(A.prompt_ids, 10, adapter=FT)


def check(cls):
    h = make(cls)
    name = h.publish_adapter(ft_state(seed=FT_ADAPTER_SEED))
    got = list(h.generate([ClientRequest("a", A.prompt_ids, 10, adapter=name)])[0].token_ids)
    return got == TRUTH, f"'{name}' (r 8, alpha 16), prompt 14: truth (PEFT) {TRUTH}; got {got}"


run("p07", check, Host)
