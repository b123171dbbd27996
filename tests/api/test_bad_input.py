"""Bad input a schema-driven fuzzer does not generate: NUL, lone surrogates, deep nesting, huge integers, huge bodies.

Each case sends one hostile request and asserts what a client is owed: a 4xx
JSON answer whose ``code`` names the problem (and, for a bad field, whose
body names the field), and that nothing changed in the database. Each case
failed before the issue-10 fixes (a 500, or Django's HTML 400 for a body
over the limit).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from gantry.core import tokens
from gantry.core.models import (
    Deployment,
    Membership,
    Organization,
    Run,
    RunEvent,
    Runner,
    RunnerGroup,
    Stack,
)
from tests.admin.helpers import url
from tests.conftest import SPEC
from tests.core.drive import drive

# The hostile strings, as a JSON text carries them: "\u0000" and a lone "\ud800".
NUL = "nul\x00byte"
SURROGATE = "lone\ud800surrogate"
HOSTILE = {"NUL": NUL, "lone surrogate": SURROGATE}


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row a request could change, for "nothing changed"."""
    models = (Organization, Membership, User, RunnerGroup, Stack, Deployment, Run, Runner, RunEvent)
    return {m.__name__: sorted(map(repr, m.objects.values())) for m in models}


def send(client: Client, method: str, path: str, body: bytes) -> Any:
    """The raw bytes as a JSON body; a crash answers 500 instead of raising into the test."""
    client.raise_request_exception = False
    return client.generic(method, path, body, content_type="application/json")


def assert_refused(response: Any, status: int = 400, *, names: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body.get("code"), str)
    assert body["code"]
    if names is not None:
        assert names in json.dumps(body.get("fields", body)), body
    return dict(body)


def encode(body: Any) -> bytes:
    # ensure_ascii: NUL and the lone surrogate travel as the escapes \u0000 and \ud800.
    return json.dumps(body, ensure_ascii=True).encode()


# ---------------------------------------------------------------- JSON-stored fields


def _stack_body(field: str, bad: str) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "new", "labels": {"team": "a"}, "spec": SPEC, "secrets": {"TOKEN": "t"}}
    if field == "spec":
        body["spec"] = {"steps": [{"name": "x", "run": f"echo {bad}"}]}
    elif field == "labels":
        body["labels"] = {"team": bad}
    else:
        body["secrets"] = {"TOKEN": bad}
    return body


# (route name, field): each JSON-stored field a request can write.
FIELD_ROUTES = [
    ("stack create", "spec"),
    ("stack create", "labels"),
    ("stack create", "secrets"),
    ("stack update", "spec"),
    ("stack update", "labels"),
    ("stack update", "secrets"),
    ("group create", "labels"),
    ("group update", "labels"),
    ("deployment spec override", "spec"),
]


def _request_for(route: str, field: str, bad: str, stack: Stack, group: RunnerGroup) -> tuple[str, str, bytes]:
    if route == "stack create":
        return "POST", "/api/v1/orgs/acme/stacks", encode(_stack_body(field, bad))
    if route == "stack update":
        return "PATCH", f"/api/v1/stacks/{stack.id}", encode({field: _stack_body(field, bad)[field]})
    if route == "group create":
        return "POST", "/api/v1/orgs/acme/runner-groups", encode({"name": "new", "labels": {"os": bad}})
    if route == "group update":
        return "PATCH", f"/api/v1/runner-groups/{group.id}", encode({"labels": {"os": bad}})
    assert route == "deployment spec override"
    return "POST", f"/api/v1/stacks/{stack.id}/deployments", encode({"spec": _stack_body("spec", bad)["spec"]})


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize(("route", "field"), FIELD_ROUTES)
def test_a_hostile_string_in_a_json_stored_field_is_refused(
    owner_api: APIClient, stack: Stack, group: RunnerGroup, route: str, field: str, kind: str
) -> None:
    method, path, body = _request_for(route, field, HOSTILE[kind], stack, group)
    before = snapshot()
    assert_refused(send(owner_api, method, path, body), names=field)
    assert snapshot() == before


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("field", ["labels", "spec", "secrets_update"])
def test_a_hostile_string_in_the_admins_add_stack_form_is_refused(
    root: User, acme: Organization, field: str, kind: str
) -> None:
    admin = Client(raise_request_exception=False)
    admin.force_login(root)
    form = {
        "organization": acme.pk,
        "name": "api",
        "labels": "{}",
        "spec": json.dumps(SPEC),
        "secrets_update": "",
    }
    bad = HOSTILE[kind]
    value = _stack_body("spec", bad)["spec"] if field == "spec" else {"TEAM" if field == "labels" else "TOKEN": bad}
    form[field] = encode(value).decode()
    before = snapshot()
    response = admin.post(url("stack", "add"), form)
    # The admin's way to refuse: the form again, with the field's error.
    assert response.status_code == 200, response.status_code
    assert b"errorlist" in response.content
    assert snapshot() == before


# ---------------------------------------------------------------- deep nesting


DEEP = b"[" * 5000


@pytest.fixture
def runner_api(stack: Stack, group: RunnerGroup) -> Callable[[str], tuple[APIClient, str, str]]:
    """A runner's client for a run driven to ``state``, with the run and runner ids."""

    def make(state: str) -> tuple[APIClient, str, str]:
        d = drive(stack, group, state)
        assert d.runner is not None
        client = APIClient()
        token = tokens.mint_runner_token(runner_id=d.runner.id, run_id=d.run.id, group_id=group.id)
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return client, str(d.run.id), str(d.runner.id)

    return make


@pytest.mark.parametrize(
    "route",
    [
        pytest.param(route)
        for route in ("POST /orgs", "POST stacks", "PATCH stack", "POST deployments", "POST runner-groups", "done")
    ],
)
def test_a_deeply_nested_body_is_refused(
    root_api: APIClient,
    owner_api: APIClient,
    stack: Stack,
    group: RunnerGroup,
    runner_api: Callable[[str], tuple[APIClient, str, str]],
    route: str,
) -> None:
    client, method, path = {
        "POST /orgs": lambda: (root_api, "POST", "/api/v1/orgs"),
        "POST stacks": lambda: (owner_api, "POST", "/api/v1/orgs/acme/stacks"),
        "PATCH stack": lambda: (owner_api, "PATCH", f"/api/v1/stacks/{stack.id}"),
        "POST deployments": lambda: (owner_api, "POST", f"/api/v1/stacks/{stack.id}/deployments"),
        "POST runner-groups": lambda: (owner_api, "POST", "/api/v1/orgs/acme/runner-groups"),
        "done": lambda: (lambda c, run, _r: (c, "POST", f"/api/v1/runs/{run}/done"))(*runner_api("running")),
    }[route]()
    before = snapshot()
    assert_refused(send(client, method, path, DEEP))
    assert snapshot() == before


# ---------------------------------------------------------------- integers beyond their columns


# Each field with the first power of two past its column (int for exit_code, sealed_chunks and pid; bigint for
# workflow_run_id, where 2^40 is a fine value) and one past any 64-bit integer.
RANGE_CASES = [
    ("done", "exit_code", (40, 70)),
    ("done", "sealed_chunks", (40, 70)),
    ("ready", "pid", (40, 70)),
    ("ready", "workflow_run_id", (63, 70)),
]


def _range_cases() -> list[Any]:
    return [
        pytest.param(route, field, 2**power, id=f"{route}.{field}=2^{power}")
        for route, field, powers in RANGE_CASES
        for power in powers
    ]


@pytest.mark.parametrize(("route", "field", "value"), _range_cases())
def test_an_integer_beyond_its_column_is_refused(
    runner_api: Callable[[str], tuple[APIClient, str, str]], route: str, field: str, value: int
) -> None:
    if route == "done":
        client, run_id, _ = runner_api("running")
        body: dict[str, Any] = {"outcome": "failure", "exit_code": 1, "sealed_chunks": 0, field: value}
        path = f"/api/v1/runs/{run_id}/done"
    else:
        client, _, runner_id = runner_api("assigned")
        body, path = {"hostname": "h", field: value}, f"/api/v1/runners/{runner_id}/ready"
    before = snapshot()
    assert_refused(send(client, "POST", path, encode(body)), names=field)
    assert snapshot() == before


# ---------------------------------------------------------------- bodies over the limit


@pytest.mark.parametrize("route", ["POST stacks", "POST deployments"])
def test_a_body_over_the_limit_is_a_json_413_logged_without_a_traceback(
    owner_api: APIClient, stack: Stack, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = "/api/v1/orgs/acme/stacks" if route == "POST stacks" else f"/api/v1/stacks/{stack.id}/deployments"
    big = encode({"name": "big", "spec": {"steps": [{"name": "x", "run": "echo " + "x" * (5 * 1024 * 1024)}]}})
    before = snapshot()
    with caplog.at_level(logging.INFO):
        response = send(owner_api, "POST", path, big)
    assert_refused(response, 413)
    assert snapshot() == before
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    assert any(r.levelno == logging.WARNING for r in caplog.records)
