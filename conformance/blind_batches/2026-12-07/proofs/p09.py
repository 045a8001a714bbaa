"""p09: a request queued on job@v1 when job@v1 is retracted must finish on job@v1's weights."""
from _common import *  # noqa: F403

Host = host_module("09").Host
V1 = adapter_dir("ft", seed=7)
A = req("a", 12, 91, 8)
TRUTH = hf_greedy(A.prompt_ids, 8, adapter=V1)


def check(cls):
    h = make(cls)
    n1 = h.publish_adapter(ft_state(seed=7, version=1))
    h.publish_adapter(ft_state(seed=8, version=2))
    h.submit(ClientRequest("a", A.prompt_ids, 8, adapter=n1))  # queued, not yet scheduled
    h.retract_adapter(n1)
    try:
        got = list(drain(h)[0].token_ids)
    except Exception as e:  # noqa: BLE001
        return False, f"request on {n1} failed after retract: {e!r}"
    base = hf_greedy(A.prompt_ids, 8)
    return got == TRUTH, (f"published {n1}, job@v2; submit on {n1}, retract_adapter({n1!r}) before any step: truth "
                          f"(PEFT {n1}) {TRUTH}; got {got}{' (== base model)' if got == base else ''}")


run("p09", check, Host)
