from common import *
RULE = ('ScheduleInterceptor.on_arrival: "Called by: the host, from whichever thread accepts requests (it may run while a '
        'step executes)... The core uses it to abort a running fine-tuning-only step"')
def check(cls):
    h = make(cls); s = sample(1, 30)
    holder = {}
    def on_begin(step_id, samples):
        t = threading.Thread(target=lambda: h.submit(ClientRequest("late", prompt(5), 1))); t.start(); t.join()
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else (),
                               abort=lambda st, k: bool(icp.arrivals), on_begin=on_begin)
    h.run_idle_step()
    rec = steps.records[-1]
    return bool(rec.aborted_sample_ids), f"request submitted during the FT-only step: on_arrival seen during it: {bool(rec.aborted_sample_ids)}; record aborted={rec.aborted_sample_ids}"
run_proof("h27_on_arrival_deferred", RULE, check, "blindhosts.h27_on_arrival_deferred:Host")
