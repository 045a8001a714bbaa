"""p29: after capture_activation(B) replaced A, captures go to B and A is never called again."""
from _common import *  # noqa: F403


def check(cls):
    h = make(cls)
    h.set_finetune_adapter(ft_state())
    s = sample(0, 10)
    h.intercept_schedule(Interceptor(lambda bt, i: [s] if i == 0 else ()))
    a, b = Sink(), Sink()
    h.capture_activation(a)
    h.capture_activation(b)
    h.run_idle_step()
    return not a.events and len(b.layers()) == 2, f"old sink: {len(a.events)} calls, new sink: {len(b.events)} calls"


run("p29", check, host_module("29").Host)
