"""p01: capabilities() must be constant for the host's lifetime (hooks.py, HostHooks.capabilities)."""
import _common as c


def check(cls):
    h = c.make(cls)
    before = h.capabilities()
    h.submit(c.req("r", 20, 1, 4))
    h.step()
    during = h.capabilities()
    c.drain(h)
    after = h.capabilities()
    ok = before == during == after
    return ok, (f"max_finetune_tokens_per_step before/while a request holds KV/after: "
                f"{before.max_finetune_tokens_per_step}/{during.max_finetune_tokens_per_step}/"
                f"{after.max_finetune_tokens_per_step}; all fields equal: {ok}")


c.run("p01", check, c.host_module("01").Host)
