"""The engine-agnostic jobs routes (``deltaserve_core.jobs_routes``) over a caller that answers as
``job_control.job_call`` does, without an engine: list paging, the error objects, the 503 of an engine that does
not answer, and the endpoint marker. The real servers run the same routes in tests/test_vllm_jobs_api.py and
tests/sglang/test_sglang_jobs_api.py."""

from __future__ import annotations

from typing import Any

import pytest

# FastAPI comes with the engines that serve these routes (vLLM, SGLang); it is not a dependency of the core
pytest.importorskip("fastapi", reason="FastAPI comes with vLLM or SGLang; neither is installed")
from fastapi import FastAPI  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from deltaserve_core.jobs_routes import CONTROL_OPS, build_jobs_router, error_answer  # noqa: E402

JOBS = [{"object": "fine_tuning.job", "id": f"ftjob-{n}", "status": "running"} for n in ("a", "b", "c")]


def _client(answers: dict[str, Any], calls: list[tuple[str, dict[str, Any]]] | None = None,
            mark: Any = None) -> TestClient:
    async def call(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append((op, args))
        answer = answers[op]
        if isinstance(answer, Exception):
            raise answer
        return answer

    app = FastAPI()
    app.include_router(build_jobs_router(call, create_refusal="declared at start-up", mark=mark))
    return TestClient(app)


def test_the_job_list_pages_with_after_and_limit() -> None:
    client = _client({"list": {"result": JOBS}})
    body = client.get("/v1/fine_tuning/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in body["data"]] == ["ftjob-a", "ftjob-b"] and body["has_more"] is True
    body = client.get("/v1/fine_tuning/jobs", params={"limit": 2, "after": "ftjob-b"}).json()
    assert [j["id"] for j in body["data"]] == ["ftjob-c"] and body["has_more"] is False
    reply = client.get("/v1/fine_tuning/jobs", params={"limit": "two"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "limit"


def test_calls_carry_their_arguments_and_errors_keep_openai_shape() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    missing = error_answer(404, "no job", code="job_not_found", param="id")
    client = _client({"get": missing, "events": {"result": {"data": [{"id": "ftevent-3"}], "has_more": True}}},
                     calls)
    reply = client.get("/v1/fine_tuning/jobs/ftjob-x")
    assert reply.status_code == 404
    assert reply.json() == {"error": {"message": "no job", "type": "invalid_request_error", "param": "id",
                                      "code": "job_not_found"}}
    body = client.get("/v1/fine_tuning/jobs/ftjob-x/events", params={"after": "ftevent-9", "limit": "1"}).json()
    assert body == {"object": "list", "data": [{"id": "ftevent-3"}], "has_more": True}
    assert calls == [("get", {"id": "ftjob-x"}), ("events", {"after": "ftevent-9", "limit": "1", "id": "ftjob-x"})]
    reply = client.post("/v1/fine_tuning/jobs")
    assert reply.status_code == 501 and reply.json()["error"]["code"] == "jobs_declared_at_startup"


@pytest.mark.parametrize("op", CONTROL_OPS)
def test_an_engine_that_does_not_answer_is_a_503(op: str) -> None:
    client = _client({op: TimeoutError("no answer within 60 s")})
    reply = client.post(f"/v1/fine_tuning/jobs/ftjob-a/{op}")
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_unavailable"
    assert "no answer within 60 s" in reply.json()["error"]["message"]


def test_the_marker_sees_every_operation() -> None:
    seen: list[str] = []

    def mark(op: str, endpoint: Any) -> Any:
        seen.append(op)
        return endpoint

    _client({}, mark=mark)
    assert sorted(seen) == sorted(["list", "create", "get", *CONTROL_OPS, "events", "checkpoints"])
