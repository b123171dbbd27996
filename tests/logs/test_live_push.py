"""POST /runs/{run_id}/logs/live: one Redis record per run, replaced on every push, best-effort."""

from __future__ import annotations

import base64
import gzip
import logging
import uuid

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from gantry import conf
from gantry.core import services, tokens
from gantry.core.models import Organization, RunnerGroup, Stack
from gantry.logs import live
from gantry.redis import client as redis_client

from ..conftest import SPEC
from ..core.drive import drive
from .conftest import Executing, bearer, gz


def test_it_stores_the_snapshot_with_a_ttl_above_the_execution_timeout(executing: Executing) -> None:
    assert executing.push(2, 2, "step one\nstep tw").status_code == 204
    record = live.get(executing.run.id)
    assert record is not None
    assert (record.chunk_index, record.sealed_chunks) == (2, 2)
    assert gzip.decompress(record.data) == b"step one\nstep tw"
    ttl = redis_client().ttl(live.KEY.format(run_id=executing.run.id))
    assert ttl > conf.get().runner_execution_timeout


def test_it_replaces_the_record_on_every_push(executing: Executing) -> None:
    executing.push(0, 0, "a")
    executing.push(1, 0, "b")
    executing.push(1, 1, "bc")
    record = live.get(executing.run.id)
    assert record is not None
    assert (record.chunk_index, record.sealed_chunks, gzip.decompress(record.data)) == (1, 1, b"bc")
    assert redis_client().keys(f"gantry:logs:live:{executing.run.id}*") == [
        live.KEY.format(run_id=executing.run.id).encode()
    ]


def test_it_answers_204_and_drops_the_push_without_redis(
    executing: Executing, caplog: pytest.LogCaptureFixture
) -> None:
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"), caplog.at_level(logging.DEBUG, "gantry.logs"):
        assert executing.push(0, 0, "lost").status_code == 204
        assert executing.push(0, 0, "lost again").status_code == 204
        assert live.get(executing.run.id) is None
    assert live.get(executing.run.id) is None  # nothing reached the real Redis either
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "one warning per outage, then debug"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"chunk_index": -1, "sealed_chunks": 0, "data": "H4sIAAAAAAAAAwMAAAAAAAAAAAA="}, "chunk_index"),
        ({"chunk_index": 0, "sealed_chunks": -1, "data": "H4sIAAAAAAAAAwMAAAAAAAAAAAA="}, "sealed_chunks"),
        ({"chunk_index": "x", "sealed_chunks": 0, "data": "H4sIAAAAAAAAAwMAAAAAAAAAAAA="}, "chunk_index"),
        ({"chunk_index": 1.5, "sealed_chunks": 0, "data": "H4sIAAAAAAAAAwMAAAAAAAAAAAA="}, "chunk_index"),
        ({"chunk_index": 0, "sealed_chunks": 0, "data": "not base64!"}, "data"),
        ({"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(b"plain text").decode()}, "data"),
        ({"chunk_index": 0, "sealed_chunks": 0}, "data"),
        ({"chunk_index": 1, "sealed_chunks": 2, "data": "H4sIAAAAAAAAAwMAAAAAAAAAAAA="}, "non_field_errors"),
    ],
)
def test_it_refuses_a_malformed_push(executing: Executing, body: dict[str, object], field: str) -> None:
    answer = executing.api.post(f"/api/v1/runs/{executing.run.id}/logs/live", body, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid_request"
    assert field in answer.json()["fields"]
    assert live.get(executing.run.id) is None


def test_it_takes_a_push_at_the_cap(executing: Executing) -> None:
    import os

    from gantry.logs.limits import CHUNK_GZIP_MAX

    at_cap = gzip.compress(os.urandom(CHUNK_GZIP_MAX - 2048), compresslevel=1)
    assert len(at_cap) <= CHUNK_GZIP_MAX
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(at_cap).decode()}
    # ~2.8 MB of JSON: over Django's DATA_UPLOAD_MAX_MEMORY_SIZE, which must not apply here.
    answer = executing.api.post(f"/api/v1/runs/{executing.run.id}/logs/live", body, format="json")
    assert answer.status_code == 204, answer.content
    record = live.get(executing.run.id)
    assert record is not None
    assert record.data == at_cap


def test_it_refuses_data_over_the_cap(executing: Executing) -> None:
    import os

    from gantry.logs.limits import CHUNK_GZIP_MAX

    big = gzip.compress(os.urandom(CHUNK_GZIP_MAX), compresslevel=1)
    assert len(big) > CHUNK_GZIP_MAX
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(big).decode()}
    answer = executing.api.post(f"/api/v1/runs/{executing.run.id}/logs/live", body, format="json")
    assert answer.status_code == 400
    assert "data" in answer.json()["fields"]
    assert live.get(executing.run.id) is None


def test_it_refuses_a_token_bound_to_another_run(executing: Executing, acme_second_stack_run: str) -> None:
    answer = executing.api.post(
        f"/api/v1/runs/{acme_second_stack_run}/logs/live",
        {"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(gz("x")).decode()},
        format="json",
    )
    assert answer.status_code == 403
    assert answer.json()["code"] == "run_binding"


def test_it_refuses_users_and_anonymous_callers(executing: Executing, teammate_api: APIClient, anon: APIClient) -> None:
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(gz("x")).decode()}
    path = f"/api/v1/runs/{executing.run.id}/logs/live"
    assert teammate_api.post(path, body, format="json").status_code == 403
    assert anon.post(path, body, format="json").status_code == 401


def test_it_drops_pushes_for_a_finished_run_quietly(executing: Executing) -> None:
    executing.advance("finish_succeeded")
    assert executing.push(0, 0, "late tick").status_code == 204
    assert live.get(executing.run.id) is None


def test_it_drops_pushes_before_the_run_is_accepted(stack: Stack, group: RunnerGroup) -> None:
    d = drive(stack, group, "assigned")
    assert d.runner is not None
    api = bearer(tokens.mint_runner_token(runner_id=d.runner.id, run_id=d.run.id, group_id=group.id))
    body = {"chunk_index": 0, "sealed_chunks": 0, "data": base64.b64encode(gz("early")).decode()}
    assert api.post(f"/api/v1/runs/{d.run.id}/logs/live", body, format="json").status_code == 204
    assert live.get(d.run.id) is None


@pytest.fixture
def acme_second_stack_run(acme: Organization) -> str:
    other = services.stack_create(org=acme, name="other", spec=SPEC)
    return str(services.deployment_create(stack=other).runs.get().id)


def test_delete_soon_drops_records_together_at_the_sweep(executing: Executing) -> None:
    run_id = executing.run.id
    assert live.store(run_id, chunk_index=0, sealed_chunks=0, data=b"x")
    live.delete_soon(run_id)
    live.delete_soon(uuid.uuid4())  # a run without a record: nothing to drop, no error
    live.flush_deletes()
    assert live.get(run_id) is None
    live.flush_deletes()  # nothing pending: a no-op
