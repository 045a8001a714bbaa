"""p23: an output that stops at EOS has one token time per token, the last equal to finish_time (h23: EOS unstamped)."""
from _common import *  # noqa: F403

P = prompt(8, 23)


def check(cls):
    h = make(cls)
    o = h.generate([ClientRequest("a", P, 14, ignore_eos=False)])[0]
    eos = h.model.config.eos_token_id
    ok = len(o.token_times) == len(o.token_ids) and o.token_times[-1] == o.finish_time
    return ok, (f"ignore_eos=False, max_tokens 14: {len(o.token_ids)} tokens (last {o.token_ids[-1]}, EOS {eos}), "
                f"{len(o.token_times)} token_times, last time == finish_time: "
                f"{bool(o.token_times) and o.token_times[-1] == o.finish_time}")


run("p23", check, host_module("23").Host)
