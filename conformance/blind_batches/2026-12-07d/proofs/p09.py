"""p09: every StepRecord.start_time is at or after the moment its batch was offered to on_schedule (the batch was
decided by then); steps are separated by a 0.2 s pause."""
from _common import *


class Timed(Interceptor):
    def __init__(self):
        super().__init__()
        self.when = {}

    def on_schedule(self, batch):
        self.when[batch.step_id] = time.monotonic()
        return super().on_schedule(batch)


def check(cls):
    h = make(cls)
    ic, rec = Timed(), Records()
    h.intercept_schedule(ic)
    h.report_step_time(rec)
    h.submit(ClientRequest("a", prompt(12, 5), 4))
    while h.has_unfinished():
        h.step()
        time.sleep(0.2)
    bad = [(r.step_id, round(ic.when[r.step_id] - r.start_time, 4)) for r in rec.records
           if r.start_time < ic.when[r.step_id]]
    return not bad, f"{len(rec.records)} steps 0.2 s apart; (step, seconds start_time precedes on_schedule): {bad}"


run("p09", check, host_module("09").Host)
