"""h02: ignore_eos=False is not honoured: requests never stop at EOS.

Rule (driver.py, ClientRequest): "``max_tokens`` new tokens after ``prompt_ids`` (stops early at EOS)", with
``ignore_eos``: a request with ``ignore_eos=False`` ends with the first EOS token it generates.

Bug: the adapter builds the engine's stop criteria from ``max_tokens`` only (the ``ignore_eos`` flag of the
client request is dropped on the way to the engine's sampling parameters, whose default here is "ignore"), so a
request that generates EOS goes on until ``max_tokens``.
Trigger: any request with ignore_eos=False whose greedy continuation reaches EOS.
"""
from deltaserve_core.testing.reference_host import ReferenceHost


class Host(ReferenceHost):
    def _is_done(self, s) -> bool:
        return len(s.output) >= s.request.max_tokens
