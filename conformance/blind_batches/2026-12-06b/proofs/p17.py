"""p17: submit refuses an adapter name the host never loaded (h17: accepted, served on the base model)."""
from _common import *  # noqa: F403

P = prompt(10, 71)


def check(cls):
    h = make(cls)
    name = h.publish_adapter(ft_state(seed=FT_ADAPTER_SEED, version=1))
    try:
        h.submit(ClientRequest("x", P, 6, adapter="job@v9"))
    except ValueError as e:
        return True, f"published {name!r}; submit(adapter='job@v9') refused: {type(e).__name__}"
    got = [list(o.token_ids) for o in drain(h)]
    return False, (f"published {name!r}; submit(adapter='job@v9', never loaded) accepted, served {got} "
                   f"(base model gives {hf_greedy(P, 6)})")


run("p17", check, host_module("17").Host)
