"""h01: a step with client decode rows + a fine-tuning row must capture the fine-tuning row's layer inputs."""
import sys
import _common as c


def check(cls):
    h = c.make(cls)
    s = c.sample(1, 12)
    ic, sink, recs = c.install(h, plan=[(), (s,)])  # step 1: two prefills; step 2: two decodes + the sample
    for i in range(2):
        h.submit(c.ClientRequest(f"r{i}", c.prompt(6, i), 4))
    h.step(); h.step()
    return c.check_captures(sink, [s])


sys.exit(c.verdict(check, "01"))
