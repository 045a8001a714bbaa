"""p27: capabilities().max_finetune_tokens_per_step equals HostConfig.max_batch_tokens (default 2048)."""
from _common import *  # noqa: F401,F403

H = host_module("27").Host


def check(cls):
    h = make(cls)
    got = h.capabilities().max_finetune_tokens_per_step
    return got == h.config.max_batch_tokens, f"HostConfig.max_batch_tokens {h.config.max_batch_tokens}; declared {got}"


run("p27", check, H)
