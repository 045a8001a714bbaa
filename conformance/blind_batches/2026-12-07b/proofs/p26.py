"""p26: has_unfinished() is True when asked from on_arrival (the request was submitted)."""
from _common import *  # noqa: F401,F403

H = host_module("26").Host


class AskingInterceptor(Interceptor):
    def __init__(self, host):
        super().__init__()
        self.host = host
        self.asked = []

    def on_arrival(self, request_id, arrival_time):
        super().on_arrival(request_id, arrival_time)
        self.asked.append((request_id, self.host.has_unfinished()))


def check(cls):
    h = make(cls)
    ic = AskingInterceptor(h)
    h.intercept_schedule(ic)
    h.submit(req("a", 8, 171, 2))
    after = h.has_unfinished()
    drain(h)
    return ic.asked == [("a", True)] and after, f"submit(a): has_unfinished() inside on_arrival {ic.asked}, after submit {after}"


run("p26", check, H)
