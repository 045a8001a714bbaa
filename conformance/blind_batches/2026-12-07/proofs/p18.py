"""p18: ClientOutput.first_token_time equals token_times[0]."""
from _common import *  # noqa: F403

Host = host_module("18").Host


def check(cls):
    h = make(cls)
    h.submit(req("a", 8, 181, 4))
    time.sleep(0.05)  # queued 50 ms before the engine steps
    o = drain(h)[0]
    return o.first_token_time == o.token_times[0], (f"4 tokens after 50 ms in the queue: first_token_time - arrival "
                                                    f"{o.first_token_time - o.arrival_time:.4f} s, token_times[0] - "
                                                    f"arrival {o.token_times[0] - o.arrival_time:.4f} s")


run("p18", check, Host)
