"""p32: has_unfinished() from another thread during a step that admits a request."""
from _common import *  # noqa: F401,F403

import threading

H = host_module("32").Host


class SlowSink(Sink):
    def __init__(self, started):
        super().__init__()
        self.started = started

    def begin_step(self, step_id, samples):
        super().begin_step(step_id, samples)
        self.started.set()
        time.sleep(0.3)


def check(cls):
    h = make(cls)
    started = threading.Event()
    ic, sk = Interceptor(lambda b, i: [sample(1, 12)] if i == 0 else []), SlowSink(started)
    h.intercept_schedule(ic)
    h.capture_activation(sk)
    h.set_finetune_adapter(ft_state(seed=FT_ADAPTER_SEED))
    h.submit(req("a", 8, 1, 3))
    seen = {}

    def poll():
        if started.wait(10):
            seen["during"] = h.has_unfinished()

    t = threading.Thread(target=poll)
    t.start()
    outs = drain(h)
    t.join()
    return (seen.get("during") is True and ids_of(outs) == ["a"],
            f"'a' submitted, step 0 (its prefill + an FT row, ~0.3 s) running: has_unfinished() from another thread -> "
            f"{seen.get('during')}; served {ids_of(outs)}")


run("p32", check, H)
