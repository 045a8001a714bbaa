"""p23: ClientOutput.token_times: first == first_token_time, last == finish_time."""
from _common import *  # noqa: F401,F403

H = host_module("23").Host


def check(cls):
    h = make(cls)
    outs = h.generate([req("a", 8, 1, 5), req("b", 9, 2, 3)])
    bad = []
    for o in outs:
        if len(o.token_times) != len(o.token_ids) or o.token_times[0] != o.first_token_time \
                or o.token_times[-1] != o.finish_time:
            bad.append((o.request_id, round(o.finish_time - o.token_times[-1], 6)))
    return not bad, f"2 outputs; (id, finish_time - last token time): {bad or 'all equal'}"


run("p23", check, H)
