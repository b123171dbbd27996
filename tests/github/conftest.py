"""Fixtures for github_actions groups: a local OIDC issuer and a local GitHub, and Gantry's settings pointing at them.

``github`` is token mode (``GANTRY_GITHUB_TOKEN``); ``github_app`` is App mode
(``GANTRY_GITHUB_APP_ID`` + a private key file). Both answer for the
repository ``acme-inc/deploys`` with the workflow ``gantry-runner.yml``
(id 161). ``GANTRY_PUBLIC_URL`` is a placeholder unless a test serves Gantry
(``live_server``) and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import launchers.github_actions as gha
from gantry import conf
from gantry.core import services
from gantry.core.models import SELECTOR_PREFIX, Organization, Run, RunnerGroup, Stack
from gantry.dispatch import oidc
from tests.conftest import SPEC
from tests.github.fakes import FakeGitHub, OidcIssuer, pem, rsa_key

OWNER, REPO, WORKFLOW, REF = "acme-inc", "deploys", "gantry-runner.yml", "main"
AUDIENCE = "gantry-test"


@pytest.fixture
def issuer() -> Iterator[OidcIssuer]:
    server = OidcIssuer()
    yield server
    server.close()


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    conf.github.cache_clear()
    oidc.reset()
    gha._no_run_details.clear()
    gha._paths.clear()


@pytest.fixture(autouse=True)
def _fresh_github_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield
    monkeypatch.undo()
    conf.github.cache_clear()
    oidc.reset()
    gha._no_run_details.clear()
    gha._paths.clear()


@pytest.fixture
def github(issuer: OidcIssuer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeGitHub]:
    server = FakeGitHub(issuer=issuer, token="ghp_test_token")
    server.add_repo(OWNER, REPO, WORKFLOW, 161)
    server.workdir = tmp_path / "actions"
    _settings(
        monkeypatch,
        GANTRY_GITHUB_API_URL=server.url,
        GANTRY_GITHUB_TOKEN="ghp_test_token",
        GANTRY_GITHUB_OIDC_ISSUER=issuer.url,
        GANTRY_GITHUB_OIDC_AUDIENCE=AUDIENCE,
        GANTRY_PUBLIC_URL="http://127.0.0.1:9",
    )
    yield server
    server.close()


@pytest.fixture
def github_app(issuer: OidcIssuer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeGitHub]:
    key = rsa_key()
    key_file = tmp_path / "app.pem"
    key_file.write_text(pem(key))
    server = FakeGitHub(issuer=issuer, app_key=key, app_id="4242")
    server.add_repo(OWNER, REPO, WORKFLOW, 161)
    monkeypatch.delenv("GANTRY_GITHUB_TOKEN", raising=False)
    _settings(
        monkeypatch,
        GANTRY_GITHUB_API_URL=server.url,
        GANTRY_GITHUB_APP_ID="4242",
        GANTRY_GITHUB_APP_PRIVATE_KEY_FILE=str(key_file),
        GANTRY_GITHUB_OIDC_ISSUER=issuer.url,
        GANTRY_GITHUB_OIDC_AUDIENCE=AUDIENCE,
        GANTRY_PUBLIC_URL="http://127.0.0.1:9",
    )
    yield server
    server.close()


def gha_group(
    org: Organization, name: str = "actions", labels: dict[str, str] | None = None, **fields: Any
) -> RunnerGroup:
    values: dict[str, Any] = {
        "kind": "github_actions", "labels": labels if labels is not None else {"ci": "github"},
        "github_owner": OWNER, "github_repo": REPO, "github_workflow": WORKFLOW, "github_ref": REF,
        "max_concurrent_runs": 1000, **fields,
    }  # fmt: skip
    group, _token = services.runner_group_create(org=org, name=name, **values)
    return group


def gha_stack(org: Organization, name: str, selector: dict[str, str] | None = None) -> Stack:
    labels = {SELECTOR_PREFIX + k: v for k, v in (selector if selector is not None else {"ci": "github"}).items()}
    return services.stack_create(org=org, name=name, labels=labels, spec=SPEC)


def pending_runs(org: Organization, n: int, *, prefix: str = "s", now: Any = None) -> list[Run]:
    """``n`` pending runs, each on a stack of its own (a stack holds one live run at a time)."""
    runs = []
    for i in range(n):
        deployment = services.deployment_create(stack=gha_stack(org, f"{prefix}{i}"), now=now)
        runs.append(Run.objects.get(deployment=deployment))
    return runs


@pytest.fixture
def make_runs() -> Callable[..., list[Run]]:
    return pending_runs
