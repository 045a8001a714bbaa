"""p27: a request naming the reserved adapter is refused, also through generate()."""
from _common import *  # noqa: F401,F403

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

H = host_module("27").Host


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    r = ClientRequest("x", prompt(8, 1), 2, adapter=RESERVED_ADAPTER_NAME)
    try:
        h.submit(r)
        sub = "accepted"
    except ValueError as e:
        sub = f"refused ({type(e).__name__})"
    h2 = make(cls)
    h2.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    try:
        outs = h2.generate([ClientRequest("y", prompt(8, 1), 2, adapter=RESERVED_ADAPTER_NAME)])
        gen, ok = f"accepted, returned {[list(o.token_ids) for o in outs]}", False
    except ValueError as e:
        gen, ok = f"refused ({type(e).__name__})", True
    return ok and sub.startswith("refused"), f"submit: {sub}; generate: {gen}"


run("p27", check, H)
