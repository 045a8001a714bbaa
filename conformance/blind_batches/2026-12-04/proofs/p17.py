"""p17: on_arrival reaches the core while a fine-tuning-only step runs (so the core can abort it)."""
import threading
import time

from _common import *  # noqa: F403

H = host_module("17").Host
SAMPLES = [sample(1, 10)]


class TimedInterceptor(Interceptor):
    def __init__(self, plan):
        super().__init__(plan)
        self.heard_at = []

    def on_arrival(self, request_id, arrival_time):
        self.heard_at.append((request_id, time.monotonic()))
        super().on_arrival(request_id, arrival_time)


class SlowSink(Sink):
    def layer_input(self, step_id, layer, sample_id, hidden):
        super().layer_input(step_id, layer, sample_id, hidden)
        time.sleep(0.4)  # a long forward


def check(cls):
    h = make(cls)
    ic = TimedInterceptor(lambda b, i: SAMPLES if i == 0 else [])
    sk = SlowSink(abort=lambda s, i: bool(ic.arrivals))  # the core aborts once it has heard of a request
    rec = Records()
    h.intercept_schedule(ic)
    h.capture_activation(sk)
    h.report_step_time(rec)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    th = threading.Thread(target=h.run_idle_step)
    th.start()
    while not sk.layers():
        time.sleep(0.005)
    t_sub = time.monotonic()
    h.submit(ClientRequest("r", prompt(6, 7), 2))  # arrives while the fine-tuning-only step runs
    th.join()
    ft = rec.records[0]
    end = ft.start_time + ft.duration_s
    outs = drain(h)
    heard = ic.heard_at[0][1] if ic.heard_at else None
    ok = heard is not None and heard <= end and [o.request_id for o in outs] == ["r"]
    return ok, (f"submitted at +{t_sub - ft.start_time:.3f}s into FT-only step {ft.step_id} (ends +{ft.duration_s:.3f}s); "
                f"on_arrival heard at +{(heard - ft.start_time) if heard else float('nan'):.3f}s; step aborted "
                f"{ft.aborted_sample_ids}, completed {ft.finetune_sample_ids}; outputs {[o.request_id for o in outs]}")


run("p17", check, H)
