"""p28: retracting job@v1 leaves job@v2 servable with its own weights (h28: every version of the job unloaded)."""
from _common import *  # noqa: F403

P = prompt(10, 91)
N = 6


def check(cls):
    h = make(cls)
    v1 = h.publish_adapter(ft_state(seed=7, version=1))
    v2 = h.publish_adapter(ft_state(seed=8, version=2))
    h.retract_adapter(v1)
    truth = hf_greedy(P, N, adapter=adapter_dir("ft", seed=8))
    try:
        got = list(h.generate([ClientRequest("a", P, N, adapter=v2)])[0].token_ids)
    except ValueError as e:
        return False, f"published {v1}, {v2}; retract_adapter({v1!r}); request on {v2!r} refused: {e}"
    return got == truth, f"published {v1}, {v2}; retract_adapter({v1!r}); {v2}: truth (PEFT) {truth}; got {got}"


run("p28", check, host_module("28").Host)
