"""The client-side helpers every engine driver shares (deltaserve_core.driver)."""

from __future__ import annotations

from deltaserve_core.driver import ClientRequest, InFlightRequests


def test_in_flight_requests_stamp_new_tokens_and_build_the_output_once():
    live = InFlightRequests()
    assert not live
    live.add(ClientRequest("a", (1, 2, 3), 3), now=10.0)
    assert "a" in live and live
    assert live.update("a", [7], 10.5, finished=False) is None
    assert live.update("a", [7], 10.6, finished=False) is None  # no new token: no new time stamp
    assert live.update("other", [1, 2], 10.7, finished=True) is None  # not submitted here: ignored
    out = live.update("a", [7, 8, 9], 11.0, finished=True)
    assert out is not None and out.token_ids == (7, 8, 9)
    assert (out.arrival_time, out.first_token_time, out.finish_time) == (10.0, 10.5, 11.0)
    assert out.token_times == (10.5, 11.0, 11.0) and out.ttft_s == 0.5
    assert "a" not in live and not live  # returned once, then forgotten: nothing grows
    assert live.update("a", [7, 8, 9], 11.1, finished=True) is None


def test_in_flight_request_finishing_without_tokens():
    live = InFlightRequests()
    live.add(ClientRequest("empty", (1,), 1), now=2.0)
    out = live.update("empty", (), 2.5, finished=True)
    assert out is not None and out.token_ids == () and out.first_token_time == out.finish_time == 2.5
