from common import *
RULE = 'HostHooks.intercept_schedule: "Install (or with None remove) the core\'s admission callback"'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    h.intercept_schedule(None)
    h.generate([ClientRequest("a", prompt(6, 1), 2)])
    return not icp.batches, f"removed interceptor still called {len(icp.batches)}x"
run_proof("h30_intercept_none_ignored", RULE, check, "blindhosts.h30_intercept_none_ignored:Host")
