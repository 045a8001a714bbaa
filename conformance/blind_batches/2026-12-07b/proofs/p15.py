"""p15: a prompt of exactly max_batch_tokens (2048) tokens is served (2 tokens) within 6 steps."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

H = host_module("15").Host


def check(cls):
    h = make(cls)
    h.submit(req("a", 2048, 101, 2))
    outs = []
    for _ in range(6):
        outs += h.step()
    toks = [len(o.token_ids) for o in outs]
    return toks == [2], f"prompt 2048 (max_batch_tokens 2048), 2 tokens; after 6 step() calls outputs {ids_of(outs)} " \
                        f"with {toks} tokens; has_unfinished {h.has_unfinished()}"


run("p15", check, H)
