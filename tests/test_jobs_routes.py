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
            mark: Any = None, on_created: Any = None) -> TestClient:
    async def call(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append((op, args))
        answer = answers[op]
        if isinstance(answer, Exception):
            raise answer
        return answer

    app = FastAPI()
    app.include_router(build_jobs_router(call, mark=mark, on_created=on_created))
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


def test_create_hands_the_body_to_the_engine_and_the_new_job_to_the_adapter() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    created: list[dict[str, Any]] = []
    refused = error_answer(409, "one job at a time", code="job_active")
    client = _client({"create": {"result": JOBS[0]}}, calls, on_created=created.append)
    body = {"model": "m", "training_file": "train.jsonl", "suffix": "a"}
    reply = client.post("/v1/fine_tuning/jobs", json=body)
    assert reply.status_code == 200 and reply.json() == JOBS[0] and created == [JOBS[0]]
    assert calls == [("create", {"body": body})]
    reply = client.post("/v1/fine_tuning/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json" and len(calls) == 1
    client = _client({"create": refused}, on_created=created.append)
    reply = client.post("/v1/fine_tuning/jobs", json=body)
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "job_active" and len(created) == 1


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
