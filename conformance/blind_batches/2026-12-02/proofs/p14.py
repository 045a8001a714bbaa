from common import *
RULE = ('HostHooks.intercept_schedule: "retires them after that one forward, and never lets them reach a client" '
        '(after an aborted fine-tuning-only step)')
def check(cls):
    h = make(cls); s = sample(5, 12)
    icp, sink, steps = install(h, policy=lambda b, k: (s,) if k == 0 else (), abort=lambda st, k: True)
    h.run_idle_step()
    h.submit(ClientRequest("a", prompt(8, 1), 2))
    outs = drain(h)
    leaked = [o.request_id for o in outs if o.request_id != "a"]
    scheduled = {r.request_id for b in icp.batches for r in b.scheduled} - {"a"}
    return not leaked and not scheduled, f"outputs of non-client ids: {leaked}; FT rows scheduled as requests: {sorted(scheduled)}"
run_proof("h14_aborted_rows_requeued_leak", RULE, check, "blindhosts.h14_aborted_rows_requeued_leak:Host")
