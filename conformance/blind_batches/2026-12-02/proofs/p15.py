from common import *
RULE = 'RESERVED_ADAPTER_NAME: "Hosts must refuse client requests naming it" (the name in another letter case)'
def check(cls):
    h = make(cls); install(h)
    accepted = []
    for name in ("__DELTASERVE_FINETUNE__", "__DeltaServe_Finetune__"):
        try:
            h.submit(ClientRequest("x-" + name, prompt(5), 1, adapter=name))
            served = [s.request.adapter for s in h._waiting if s.request.request_id == "x-" + name]
            accepted.append(f"{name!r} accepted, served on {served}")
        except Exception:
            pass
    return not accepted, "; ".join(accepted) or "refused"
run_proof("h15_reserved_name_casefold", RULE, check, "blindhosts.h15_reserved_name_casefold:Host")
