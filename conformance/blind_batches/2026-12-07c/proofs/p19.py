"""p19: step sinks accumulate. Truth: which sink was installed when each step ran."""
from _common import *


def check(cls):
    h = make(cls)
    first, second = Records(), Records()
    h.report_step_time(first)
    h.generate([req("a", 8, 191, 2)])
    n1 = len(first.records)
    h.report_step_time(second)  # a new session installs its own sink
    h.generate([req("b", 8, 192, 3)])
    late = len(first.records) - n1
    return late == 0 and len(second.records) == 3, (f"records to the first sink after it was replaced: {late}; "
                                                     f"to the second: {len(second.records)} (3 steps)")


run("p19", check, host_module("19").Host)
