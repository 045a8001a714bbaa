"""p09: run_idle_step never runs client work; every submitted request's output comes out of step() once."""
from _common import *  # noqa: F403

H = host_module("09").Host


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    reqs = [ClientRequest("short", prompt(6, 1), 1), ClientRequest("long", prompt(9, 2), 4)]
    for r in reqs:
        h.submit(r)
    ran = h.run_idle_step()  # the serving loop's idle branch, racing the submits
    offered = [[s.request_id for s in b.scheduled] for b in ic.batches]
    outs = [o.request_id for o in drain(h)]
    ok = sorted(outs) == ["long", "short"] and all(not s for s in offered)
    return ok, (f"run_idle_step() -> {ran}, batches it offered scheduled {offered}; outputs from step(): {outs} "
                f"(submitted ['short', 'long'])")


run("p09", check, H)
