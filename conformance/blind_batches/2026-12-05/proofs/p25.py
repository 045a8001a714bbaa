"""p25: generate returns exactly one output per request it was given, in request order (driver.py, generate)."""
import _common as c


def check(cls):
    h = c.make(cls)
    h.submit(c.req("a", 5, 15, 2))
    outs = h.generate([c.req("b", 6, 16, 4)])
    got = [o.request_id for o in outs]
    truth = c.hf_greedy(c.prompt(6, 16), 4)
    ok = got == ["b"] and list(outs[0].token_ids) == truth
    return ok, f"submit('a') then generate(['b']) returned outputs for {got}"


c.run("p25", check, c.host_module("25").Host)
