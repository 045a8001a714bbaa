"""p32: a request submitted from another thread while a step executes is accepted and announced at once (on_arrival
"may run while a step executes ... Must not block"; HostDriver.submit), and served later."""
import threading
import time

import _common as c


class SlowSink(c.Sink):
    """The core's sink, with layers made slow (0.3 s each) so the fine-tuning-only step is long."""

    def __init__(self):
        super().__init__()
        self.begun = threading.Event()

    def begin_step(self, step_id, samples):
        super().begin_step(step_id, samples)
        self.begun.set()

    def layer_input(self, step_id, layer, sample_id, hidden):
        super().layer_input(step_id, layer, sample_id, hidden)
        time.sleep(0.3)


def check(cls):
    s1 = c.sample(1, 10)
    h = c.make(cls)
    ic = c.Interceptor(plan=lambda b, i: [s1] if i == 0 else [])
    sk, rec = SlowSink(), c.Records()
    h.intercept_schedule(ic)
    h.capture_activation(sk)
    h.report_step_time(rec)
    h.set_finetune_adapter(c.ft_state(seed=c.FT_ADAPTER_SEED))
    t = threading.Thread(target=h.run_idle_step)
    t0 = time.monotonic()
    t.start()
    sk.begun.wait(10)
    a = time.monotonic()
    h.submit(c.req("r", 6, 23, 2))
    b = time.monotonic()
    t.join()
    step_end = time.monotonic()
    heard = ic.arrivals[0][1] if ic.arrivals else None
    outs = c.drain(h)
    ok = (b - a) < 0.15 and heard is not None and heard < step_end - 0.2 and [o.request_id for o in outs] == ["r"]
    return ok, (f"submit at +{a - t0:.3f}s into a ~0.6 s fine-tuning-only step: submit() took {b - a:.3f}s, "
                f"on_arrival at +{(heard - t0) if heard else float('nan'):.3f}s, step ended +{step_end - t0:.3f}s; "
                f"served later: {[o.request_id for o in outs]}")


c.run("p32", check, c.host_module("32").Host)
