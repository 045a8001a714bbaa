"""h24: on_arrival is delivered when the request enters the host (by the time submit returns)."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    h.submit(c.ClientRequest("r", c.prompt(5), 2))
    if [a[0] for a in ic.arrivals] != ["r"]:
        return False, f"arrivals after submit: {ic.arrivals}"
    c.drain(h)
    return (len(ic.arrivals) == 1), f"arrivals {[a[0] for a in ic.arrivals]}"


sys.exit(c.verdict(check, "24"))
