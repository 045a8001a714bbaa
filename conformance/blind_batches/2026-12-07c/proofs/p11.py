"""p11: outputs capped at max_position_embeddings. Truth: arithmetic (max_tokens tokens)."""
from _common import *

P = prompt(1020, 111)  # max_position_embeddings 1024, max_batch_tokens 2048 (default)


def check(cls):
    h = make(cls)
    got = list(h.generate([ClientRequest("a", P, 8)])[0].token_ids)
    return len(got) == 8, f"prompt 1020 (max_position_embeddings 1024), max_tokens 8: got {len(got)} tokens {got}"


run("p11", check, host_module("11").Host)
