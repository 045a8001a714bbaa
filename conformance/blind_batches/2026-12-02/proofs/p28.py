from common import *
from collections import Counter
RULE = 'ScheduleInterceptor.on_arrival: "once per client request" (40 requests, some wait)'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    for i in range(40): h.submit(ClientRequest(f"r{i}", prompt(6, i), 2))
    drain(h)
    c = Counter(a[0] for a in icp.arrivals)
    bad = {k: v for k, v in c.items() if v != 1}
    return not bad and len(c) == 40, f"requests announced != once: {len(bad)} (e.g. {list(bad.items())[:2]})"
run_proof("h28_on_arrival_repeated_for_waiting", RULE, check, "blindhosts.h28_on_arrival_repeated_for_waiting:Host")
