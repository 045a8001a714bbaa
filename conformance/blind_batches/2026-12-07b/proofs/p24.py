"""p24: an FT-only step aborted before layer 1 reports a duration covering layer 0."""
from _common import *  # noqa: F401,F403
from _common import CACHE  # noqa: F401

import time as _t

H = host_module("24").Host


class TimedSink(Sink):
    def __init__(self):
        super().__init__(abort=lambda s, i: i == 1)
        self.times = []

    def should_abort(self, step_id):
        self.times.append(_t.monotonic())
        return super().should_abort(step_id)


def check(cls):
    h = make(cls)
    ic, sk, rec = install(h, plan=lambda b, i: [sample(1, 64)] if i == 0 else [])
    sk = TimedSink()
    h.capture_activation(sk)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    ran = h.run_idle_step()
    r = rec.records[0]
    layer0 = sk.times[1] - sk.times[0]
    ok = r.aborted_sample_ids == (1,) and r.duration_s >= layer0 > 0
    return ok, f"FT-only step aborted before layer 1 (ran={ran}): aborted {r.aborted_sample_ids}, duration_s " \
               f"{r.duration_s:.6f}; layer 0 took {layer0:.6f} s (between the two should_abort calls)"


run("p24", check, H)
