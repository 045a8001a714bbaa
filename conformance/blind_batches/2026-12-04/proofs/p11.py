"""p11: submit refuses a client request naming the reserved fine-tuning adapter (and announces no arrival)."""
from _common import *  # noqa: F403
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

H = host_module("11").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    try:
        h.submit(ClientRequest("x", prompt(6, 5), 3, adapter=RESERVED_ADAPTER_NAME))
    except ValueError as e:
        return not ic.arrivals, f"refused: {type(e).__name__}; arrivals announced {ic.arrivals}"
    outs = drain(h)
    return False, (f"accepted a request on {RESERVED_ADAPTER_NAME!r}: arrivals {[a for a, _ in ic.arrivals]}, "
                   f"client got tokens {[list(o.token_ids) for o in outs]}")


run("p11", check, H)
