from common import *
RULE = ('HostHooks.intercept_schedule: the returned samples join as "prefill-only rows on the reserved adapter" and the '
        'host "never lets them reach a client": a base-model request sharing steps with FT rows and a client adapter')
def run(cls, inject):
    h = make(cls); s = sample(1, 16)
    install(h, policy=lambda b, k: (s,) if inject else ())
    outs = h.generate([ClientRequest("base", prompt(8, 1), 6), ClientRequest("c", prompt(8, 2), 6, adapter="client")])
    return [o.token_ids for o in outs]
def check(cls):
    a, b = run(cls, False), run(cls, True)
    return a == b, f"without injection {a[0]}, with injection {b[0]} (base request)"
run_proof("h41_base_rows_get_slot0", RULE, check, "blindhosts.h41_base_rows_get_slot0:Host")
