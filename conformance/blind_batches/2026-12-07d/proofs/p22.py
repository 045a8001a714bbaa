"""p22: submit() refuses a request on adapter "" (no adapter of that name was loaded: the host has none)."""
from _common import *


def check(cls):
    h = make(cls)
    try:
        h.submit(ClientRequest("a", prompt(12, 5), 3, adapter=""))
    except ValueError as exc:
        return True, f"refused: {exc}"
    outs = drain(h)
    return False, f"adapter '' accepted; outputs {[(o.request_id, list(o.token_ids)) for o in outs]}"


run("p22", check, host_module("22").Host)
