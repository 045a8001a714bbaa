"""p26: once generate() has returned, the step sink holds exactly one record per step the host ran (the steps the
interceptor was offered and that executed), in step order."""
from _common import ClientRequest, host_module, install, make, prompt, run


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h)
    h.generate([ClientRequest("r", prompt(6, 7), 3)])
    proposed = [b.step_id for b in ic.batches]
    got = [r.step_id for r in rec.records]
    return got == proposed and len(got) == 3, f"steps run {proposed}, records delivered {got}"


run("p26", check, host_module("26").Host)
