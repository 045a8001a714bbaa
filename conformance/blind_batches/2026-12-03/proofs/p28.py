"""p28: step() returns each finished request once, in the step it finished (arithmetic: one output per request;
a request of max_tokens n alone in its prefill step finishes in its n-th step)."""
from _common import ClientRequest, host_module, make, prompt, run


def check(cls):
    h = make(cls)
    h.submit(ClientRequest("short", prompt(5, 1), 2))
    h.submit(ClientRequest("long", prompt(5, 2), 5))
    seen = []
    for i in range(20):
        if not h.has_unfinished():
            break
        seen.append((i + 1, [o.request_id for o in h.step()]))
    flat = [rid for _, ids in seen for rid in ids]
    ok = sorted(flat) == ["long", "short"] and dict((r, s) for s, ids in seen for r in ids) == {"short": 2, "long": 5}
    return ok, f"outputs per step {seen}"


run("p28", check, host_module("28").Host)
