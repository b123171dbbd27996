"""Stack secrets: encrypted at rest, names only in every answer, plain only inside the RunContext (issue 10)."""

from __future__ import annotations

import importlib

import pytest
from cryptography.fernet import Fernet
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from gantry.core import secrets, services
from gantry.core.models import Organization, RunnerGroup, Stack
from tests.conftest import SPEC

VALUE = "prod-deploy-key-8d1c0e55"


def stored_text() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(string_agg(secrets::text, ' '), '') FROM stack")
        return str(cur.fetchone()[0])


@pytest.fixture
def fresh_keys(settings: pytest.FixtureRequest) -> object:
    yield settings
    secrets.reset_keys()


def test_the_column_holds_no_plain_secret_and_no_answer_shows_one(owner_api: APIClient, acme: Organization) -> None:
    body = {"name": "api", "spec": SPEC, "secrets": {"DEPLOY_KEY": VALUE}}
    created = owner_api.post("/api/v1/orgs/acme/stacks", body, format="json")
    assert created.status_code == 201, created.json()
    assert VALUE not in created.content.decode()
    assert created.json()["secret_names"] == ["DEPLOY_KEY"]
    assert VALUE not in stored_text()
    assert "DEPLOY_KEY" in stored_text()  # names stay readable
    stack_id = created.json()["id"]
    for path in (f"/api/v1/stacks/{stack_id}", "/api/v1/orgs/acme/stacks"):
        assert VALUE not in owner_api.get(path).content.decode()
    patched = owner_api.patch(f"/api/v1/stacks/{stack_id}", {"secrets": {"OTHER": VALUE}}, format="json")
    assert patched.status_code == 200
    assert VALUE not in patched.content.decode()
    assert VALUE not in stored_text()


def test_only_the_run_context_carries_the_value(stack: Stack, group: RunnerGroup) -> None:
    services.stack_set_secrets(stack=stack, changes={"DEPLOY_KEY": VALUE})
    services.deployment_create(stack=stack)
    from gantry.dispatch import claim as dispatch

    got = dispatch.claim(group=group)
    assert got is not None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {got.runner_token}")
    assert client.post(f"/api/v1/runners/{got.runner_id}/ready", {}, format="json").status_code == 204
    context = client.post(f"/api/v1/runs/{got.run_id}/accept").json()
    assert context["secrets"] == {"DEPLOY_KEY": VALUE}


def test_keys_rotate_without_losing_a_secret(stack: Stack, settings: object, fresh_keys: object) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GANTRY_SECRETS_KEYS = old  # type: ignore[attr-defined]
    secrets.reset_keys()
    services.stack_set_secrets(stack=stack, changes={"DEPLOY_KEY": VALUE})

    settings.GANTRY_SECRETS_KEYS = f"{new},{old}"  # type: ignore[attr-defined]
    secrets.reset_keys()
    call_command("rotate_secrets")

    settings.GANTRY_SECRETS_KEYS = new  # type: ignore[attr-defined]
    secrets.reset_keys()
    stack.refresh_from_db()
    assert secrets.unseal(stack.secrets) == {"DEPLOY_KEY": VALUE}

    settings.GANTRY_SECRETS_KEYS = old  # type: ignore[attr-defined]
    secrets.reset_keys()
    with pytest.raises(secrets.SecretUnreadable, match="DEPLOY_KEY"):
        secrets.unseal(stack.secrets)


def test_the_migration_encrypts_values_stored_in_the_clear(stack: Stack) -> None:
    Stack.objects.filter(id=stack.id).update(secrets={"DEPLOY_KEY": VALUE})  # as before the migration
    migration = importlib.import_module("gantry.core.migrations.0009_stack_secrets_encrypted")
    migration.encrypt(apps, None)
    assert VALUE not in stored_text()
    stack.refresh_from_db()
    assert secrets.unseal(stack.secrets) == {"DEPLOY_KEY": VALUE}
    migration.decrypt(apps, None)
    stack.refresh_from_db()
    assert stack.secrets == {"DEPLOY_KEY": VALUE}


@pytest.mark.parametrize(
    ("secrets_body", "why"),
    [
        ({"1BAD NAME": "v"}, "not a valid variable name"),
        ({"PATH": "/evil"}, "reserved"),
        ({"GANTRY_RUN_ID": "spoof"}, "reserved"),
        ({"LD_PRELOAD": "/tmp/x.so"}, "reserved"),
        ({"OK": 5}, "strings"),
    ],
)
def test_secret_names_a_shell_cannot_use_or_must_not_set_are_refused(
    owner_api: APIClient, acme: Organization, secrets_body: dict[str, object], why: str
) -> None:
    response = owner_api.post("/api/v1/orgs/acme/stacks", {"name": "s", "secrets": secrets_body}, format="json")
    assert response.status_code == 400
    assert why in response.json()["detail"]
    assert not Stack.objects.filter(name="s").exists()
