"""p22: retracted version accepted while resident. Truth: the rule (refused after the retraction)."""
from _common import *


def check(cls):
    h = make(cls)
    v1 = h.publish_adapter(ft_state(seed=7, version=1))
    h.publish_adapter(ft_state(seed=9, version=2))
    h.submit(ClientRequest("a", prompt(10, 221), 8, adapter=v1))
    h.step()  # a is decoding on v1
    h.retract_adapter(v1)
    try:
        h.submit(ClientRequest("b", prompt(9, 222), 4, adapter=v1))
    except ValueError as e:
        drain(h)
        return True, f"after retract_adapter({v1!r}) with a still decoding on it: b refused ({e})"
    outs = drain(h)
    return False, f"after retract_adapter({v1!r}) with a still decoding on it: b accepted; outputs {[o.request_id for o in outs]}"


run("p22", check, host_module("22").Host)
