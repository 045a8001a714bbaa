"""p23: generate() refuses published versions. Truth: PEFT greedy decoding of the published weights."""
from _common import *

P = prompt(12, 231)
TRUTH = hf_greedy(P, 6, adapter=adapter_dir("ft", seed=7))


def check(cls):
    h = make(cls)
    name = h.publish_adapter(ft_state(seed=7, version=3))
    try:
        got = list(h.generate([ClientRequest("a", P, 6, adapter=name)])[0].token_ids)
    except Exception as e:  # noqa: BLE001
        return False, f"generate() on {name!r}: {type(e).__name__}: {e}"
    return got == TRUTH, f"generate() on {name!r}: truth (PEFT seed 7) {TRUTH}; got {got}"


run("p23", check, host_module("23").Host)
