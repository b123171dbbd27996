"""Schema-driven fuzzing: schemathesis generates requests from the served OpenAPI schema, as four personas.

The schema is the one Gantry serves (``GET /api/v1/schema?format=json``),
loaded through the WSGI application in this process: no network at all.
For each persona — a superuser, a member of the org, the org's runner group
(its JWT) and a runner holding a claimed run (its JWT) — and each operation,
hypothesis draws ``MAX_EXAMPLES`` requests, valid and invalid ones
(schemathesis' positive and negative modes), from a fixed seed. Half of them
get the ids of real objects the persona may reach in their path, so the
fuzzer gets past the 404s. Every answer is judged by schemathesis' checks:
no 5xx, a documented status code and content type, a body matching the
response schema. Failures are collected, not raised at the first, so the
figures (requests, 5xx, mismatches) count a whole run; the test fails if
any was found. ``GANTRY_FUZZ_SEED`` and ``GANTRY_FUZZ_EXAMPLES`` override
the seed and the bound (docs/testing.md).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gantry.core import services, tokens
from gantry.core.models import Membership, Organization, Role, RunnerGroup
from tests.conftest import SPEC
from tests.figures import add_figures

pytestmark = pytest.mark.fuzz

SEED = int(os.environ.get("GANTRY_FUZZ_SEED") or 20240610)
MAX_EXAMPLES = int(os.environ.get("GANTRY_FUZZ_EXAMPLES") or 25)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# The personas in the order they run: the least destructive first (the superuser may rotate
# the group's token or force-delete the runner, which only turns later requests into 401s).
PERSONAS = ("runner", "group", "member", "superuser")

# Mismatches found, reported and not yet fixed, each with the explicit test that fails until
# it is (below): the fuzzer counts them apart so that anything new still fails the run.
KNOWN: dict[str, re.Pattern[str]] = {}


def known_5xx(case: Any) -> str | None:
    """A 5xx already filed and tested on its own (none today): counted apart rather than failing the run."""
    return None


# The log upload (PUT /log-uploads/<token>) takes a gzip chunk: raw bytes, like octet-stream.
schemathesis.serializer.alias("application/gzip", "application/octet-stream")


@dataclass
class World:
    """What exists before the fuzzing starts, and each persona's Authorization header."""

    headers: dict[str, str]
    ids: dict[str, str]  # path parameter values of real objects, by "<route prefix>:<name>"


@dataclass
class Figures:
    requests: Counter[str] = field(default_factory=Counter)  # persona → requests sent
    server_errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    known: Counter[str] = field(default_factory=Counter)  # KNOWN name → mismatches of that kind

    def mismatch(self, what: str) -> None:
        for name, pattern in KNOWN.items():
            if pattern.search(what):
                self.known[name] += 1
                return
        self.mismatches.append(what)

    def lines(self) -> list[str]:
        per = ", ".join(f"{p}={self.requests[p]}" for p in PERSONAS)
        return [
            f"seed={SEED} max_examples={MAX_EXAMPLES} per operation and persona",
            f"requests={sum(self.requests.values())} ({per})",
            f"5xx={len(self.server_errors)} mismatches={len(self.mismatches)} "
            f"(known and counted apart: {sum(self.known.values())})",
            *(f"  known: {n} x {name}" for name, n in self.known.items()),
            *(f"  5xx: {e}" for e in self.server_errors[:50]),
            *(f"  mismatch: {m}" for m in self.mismatches[:50]),
        ]


@pytest.fixture
def world(transactional_db: None) -> World:
    """An org with a stack, a runner group and a run that group's runner has claimed (so it holds a runner JWT).

    transactional_db: requests run through the WSGI app on this thread and
    commit for real; a database error in one request must not poison the
    test's own transaction for every request after it.
    """
    org = Organization.objects.create(slug="acme", name="Acme")
    root = User.objects.create_superuser(username="root", password="pw-root", email="root@example.com")
    member = User.objects.create_user(username="teammate", password="pw-teammate")
    Membership.objects.create(user=member, organization=org, role=Role.MEMBER)
    group, group_token = services.runner_group_create(org=org, name="linux", labels={"os": "linux"})
    stack = services.stack_create(org=org, name="web", labels={"gantry:runner-group:os": "linux"}, spec=SPEC)
    deployment = services.deployment_create(stack=stack)
    claim = claim_one(group)
    runner_token = tokens.mint_runner_token(runner_id=claim["runner_id"], run_id=claim["run_id"], group_id=group.id)

    return World(
        headers={
            "superuser": f"Token {Token.objects.create(user=root).key}",
            "member": f"Token {Token.objects.create(user=member).key}",
            "group": f"Bearer {group_token}",
            "runner": f"Bearer {runner_token}",
        },
        ids={
            "org": org.slug,
            "stacks:pk": str(stack.id),
            "runner-groups:pk": str(group.id),
            "deployments:pk": str(deployment.id),
            "runs:pk": str(claim["run_id"]),
            "run_id": str(claim["run_id"]),
            "runner_id": str(claim["runner_id"]),
            "n": "0",
        },
    )


def claim_one(group: RunnerGroup) -> dict[str, Any]:
    """The group's coordinator polls once, through the API, and gets the run: a stub runner and its JWT."""
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {tokens.mint_group_token(group_id=group.id, token_version=group.token_version)}"
    )
    response = client.get("/api/v1/runner-groups/poll")
    assert response.status_code == 200, response.content
    return dict(response.json())


def real_path(operation_path: str, params: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """``params`` with every parameter that names a real object replaced by that object's id."""
    prefix = operation_path.split("/")[3] if operation_path.count("/") >= 3 else ""
    out = dict(params)
    for name in params:
        value = ids.get(f"{prefix}:{name}") or ids.get(name)
        if value is not None:
            out[name] = value
    return out


def operations(schema: Any) -> Iterator[Any]:
    for result in schema.get_all_operations():
        yield result.ok()


def fuzz_operation(operation: Any, persona: str, world: World, figures: Figures) -> None:
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE) | operation.as_strategy(
        generation_mode=schemathesis.GenerationMode.NEGATIVE
    )

    @seed(SEED)
    @settings(
        max_examples=MAX_EXAMPLES,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=["generate"],  # no shrinking: every failure is counted, none is hunted down
    )
    @given(case=strategy, real=st.booleans())
    def one(case: Any, real: bool) -> None:
        if real and case.path_parameters:
            case.path_parameters = real_path(operation.path, case.path_parameters, world.ids)
        if case.query and "wait" in case.query:
            case.query = {**case.query, "wait": 0}  # a parked long poll would only cost time
        figures.requests[persona] += 1
        response = case.call(headers={"Authorization": world.headers[persona]})
        where = f"{persona} {case.method} {case.formatted_path} → {response.status_code}"
        if response.status_code >= 500:
            known = known_5xx(case)
            if known is not None:
                figures.known[known] += 1
                return
            figures.server_errors.append(f"{where} body={str(case.body)[:200]}")
        try:
            case.validate_response(response, checks=[c for c in CHECKS if c is not not_a_server_error])
        except BaseExceptionGroup as exc:  # schemathesis' FailureGroup: every check that failed
            figures.mismatch(f"{where}: {one_line(exc)}")

    one()


def one_line(exc: BaseExceptionGroup) -> str:
    return "; ".join(re.sub(r"\s+", " ", str(e))[:200] for e in exc.exceptions)


def test_the_served_schema_holds_for_every_persona(world: World, request: pytest.FixtureRequest) -> None:
    from gantry.wsgi import application

    schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", application)
    figures = Figures()
    try:
        for persona in PERSONAS:
            for operation in operations(schema):
                fuzz_operation(operation, persona, world, figures)
    finally:
        add_figures(request.config, "schemathesis", figures.lines())
    assert figures.requests[PERSONAS[-1]] > 0
    assert (figures.server_errors, figures.mismatches) == ([], [])


@pytest.mark.parametrize(
    ("method", "path", "operation"),
    [
        ("post", "/api/v1/runners/not-a-uuid/ready", ("/api/v1/runners/{runner_id}/ready", "post")),
        ("delete", "/api/v1/runners/not-a-uuid/deregister", ("/api/v1/runners/{runner_id}/deregister", "delete")),
        ("post", "/api/v1/runs/not-a-uuid/logs/live", ("/api/v1/runs/{run_id}/logs/live", "post")),
    ],
    ids=["ready", "deregister", "logs-live"],
)
def test_a_malformed_id_answers_a_documented_status(
    world: World, method: str, path: str, operation: tuple[str, str]
) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=world.headers["runner"])
    response = getattr(client, method)(path, {}, format="json")
    schema = APIClient().get("/api/v1/schema?format=json").json()
    documented = schema["paths"][operation[0]][operation[1]]["responses"]
    assert str(response.status_code) in documented, (response.status_code, sorted(documented))
