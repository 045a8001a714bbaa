from common import *
RULE = 'StepRecord: "duration_s is the device-complete wall time of the forward step (for asynchronous hosts: measured after the device finished, not when the launch returned)"'
def check(cls):
    h = make(cls); icp, sink, steps = install(h)
    for i in range(4): h.submit(ClientRequest(f"r{i}", prompt(400, i), 1))
    t0 = time.monotonic(); h.step(); wall = time.monotonic() - t0
    d = steps.records[-1].duration_s
    return d >= 0.5 * wall, f"duration_s {d*1e3:.1f} ms vs step wall {wall*1e3:.1f} ms"
run_proof("h07_duration_launch_only", RULE, check, "blindhosts.h07_duration_launch_only:Host")
