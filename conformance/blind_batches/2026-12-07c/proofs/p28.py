"""p28: an abort rolls the waiting queue back. Truth: which requests were submitted (each returns max_tokens tokens)."""
from _common import *

S = [sample(1, 10)]
R = req("r", 9, 281, 3)


def check(cls):
    h = make(cls)

    def abort(step_id, i):  # the request arrives while layer 0 runs; the core aborts at the next boundary
        if i == 1:
            h.submit(R)
            return True
        return False

    ic, sk, rec = install(h, plan=lambda b, i: S if i == 0 else [], abort=abort)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    aborted = rec.records[-1].aborted_sample_ids if rec.records else None
    pending = h.has_unfinished()
    outs = drain(h)
    got = [(o.request_id, len(o.token_ids)) for o in outs]
    return ran and aborted == (1,) and got == [("r", 3)], (
        f"r submitted during a fine-tuning-only step, step aborted {aborted}; has_unfinished() {pending}; "
        f"outputs (id, tokens) {got}")


run("p28", check, host_module("28").Host)
