"""p06: on_arrival once per client request, also for requests sent through generate() (hooks.py, on_arrival)."""
import _common as c


def check(cls):
    h = c.make(cls)
    ic, sk, rec = c.install(h)
    outs = h.generate([c.req("a", 5, 5, 3), c.req("b", 7, 6, 3)])
    heard = [rid for rid, _ in ic.arrivals]
    ok = sorted(heard) == ["a", "b"] and [o.request_id for o in outs] == ["a", "b"]
    return ok, f"generate(['a', 'b']) returned {[o.request_id for o in outs]}; on_arrival heard {heard}"


c.run("p06", check, c.host_module("06").Host)
