"""p17: after generate([a]) returned a's output, nothing is unfinished and the next step() returns nothing."""
from _common import *


def check(cls):
    h = make(cls)
    out = h.generate([ClientRequest("a", prompt(12, 5), 3)])
    u = h.has_unfinished()
    later = [o.request_id for o in h.step()]
    return not u and not later, f"generate -> {[o.request_id for o in out]}; has_unfinished {u}; next step() {later}"


run("p17", check, host_module("17").Host)
