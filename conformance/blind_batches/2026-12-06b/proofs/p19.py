"""p19: after shutdown() no client request of the host (nor its KV cache) is still referenced (h19: last batch kept)."""
import gc

from _common import *  # noqa: F403
from deltaserve_core.testing.reference_host import _Seq  # noqa: E402


def check(cls):
    h = make(cls)
    tag = cls.__module__
    h.submit(req(f"{tag}-a", 8, 1, 30))
    h.submit(req(f"{tag}-b", 12, 2, 30))
    for _ in range(3):
        h.step()
    h.shutdown()
    gc.collect()
    alive = [(o.request.request_id, o.context) for o in gc.get_objects()
             if isinstance(o, _Seq) and o.request.request_id.startswith(tag)]
    return not alive, (f"2 requests (30 tokens) after 3 steps, shutdown(), host object kept: requests still "
                       f"referenced (id, KV tokens): {alive}")


run("p19", check, host_module("19").Host)
