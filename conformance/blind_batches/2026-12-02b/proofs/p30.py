"""h30: a request submitted from another thread while a step executes is served."""
import sys
import threading
import _common as c


class LateSink(c.Sink):
    host = None
    fired = False

    def layer_input(self, step_id, layer, sample_id, hidden):
        super().layer_input(step_id, layer, sample_id, hidden)
        if not self.fired:
            self.fired = True
            t = threading.Thread(target=self.host.submit, args=(c.ClientRequest("late", c.prompt(5, 9), 2),))
            t.start(); t.join()


def check(cls):
    h = c.make(cls)
    ic, _, recs = c.install(h, plan=[(c.sample(22, 8),)])
    sink = LateSink(); sink.host = h
    h.capture_activation(sink)
    h.submit(c.ClientRequest("early", c.prompt(6, 1), 2))
    outs = c.drain(h)
    ids = sorted(o.request_id for o in outs)
    return (ids == ["early", "late"]), f"finished {ids}; arrivals {[a[0] for a in ic.arrivals]}"


sys.exit(c.verdict(check, "30"))
