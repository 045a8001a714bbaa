from common import *
RULE = 'HostHooks.intercept_schedule: "It calls interceptor.on_arrival for each client request"'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    h.generate([ClientRequest(f"r{i}", prompt(6, i), 2) for i in range(3)])
    return sorted(a[0] for a in icp.arrivals) == ["r0", "r1", "r2"], f"on_arrival for {sorted(a[0] for a in icp.arrivals)}"
run_proof("h38_on_arrival_never", RULE, check, "blindhosts.h38_on_arrival_never:Host")
