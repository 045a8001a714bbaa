"""h23: a client request on the reserved adapter is refused, also once the reserved adapter is loaded."""
import sys
import _common as c
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ReservedAdapterError


def check(cls):
    h = c.make(cls)
    ic, sink, recs = c.install(h)
    try:
        h.submit(c.ClientRequest("r", c.prompt(5), 2, adapter=RESERVED_ADAPTER_NAME))
    except ReservedAdapterError:
        return True, "refused"
    return False, "accepted a client request on the reserved adapter"


sys.exit(c.verdict(check, "23"))
