from common import *
from collections import Counter
RULE = 'ScheduleInterceptor.on_schedule: "Called by: the host\'s scheduler ... exactly once per step" (40 requests > max_running_requests=32)'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    for i in range(40): h.submit(ClientRequest(f"r{i}", prompt(6, i), 2))
    drain(h)
    c = Counter(b.step_id for b in icp.batches)
    bad = {k: v for k, v in c.items() if v != 1}
    return not bad, f"on_schedule calls per step_id != 1: {bad}" if bad else f"{len(c)} steps, one call each"
run_proof("h03_on_schedule_twice_when_backlogged", RULE, check, "blindhosts.h03_on_schedule_twice_when_backlogged:Host")
