from common import *
RULE = 'HostHooks.capture_activation: "Install (or remove) the activation sink; the host then feeds it" (a second install replaces the first)'
def check(cls):
    h = make(cls); s = sample(1, 12)
    icp, sink_a, steps = install(h, policy=lambda b, k: (s,))
    h.run_idle_step()
    sink_b = Sink(); h.capture_activation(sink_b)
    n_a = len(sink_a.layers())
    h.run_idle_step()
    return len(sink_b.layers()) == LAYERS and len(sink_a.layers()) == n_a, f"after re-install: new sink got {len(sink_b.layers())} captures, old sink {len(sink_a.layers()) - n_a}"
run_proof("h31_capture_second_install_ignored", RULE, check, "blindhosts.h31_capture_second_install_ignored:Host")
