"""p10: after retract_adapter(name), submit on that name must be refused like a never-loaded adapter."""
from _common import *  # noqa: F403

Host = host_module("10").Host


def check(cls):
    h = make(cls)
    n1 = h.publish_adapter(ft_state(seed=7, version=1))
    h.publish_adapter(ft_state(seed=8, version=2))
    h.retract_adapter(n1)
    try:
        h.submit(req("a", 8, 101, 4, adapter=n1))
    except ValueError as e:
        return True, f"retract_adapter({n1!r}); submit on it refused: {e}"
    out = drain(h)
    return False, f"retract_adapter({n1!r}); submit on it accepted, served {[list(o.token_ids) for o in out]}"


run("p10", check, Host)
