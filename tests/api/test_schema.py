"""The committed contract (schema/openapi.yaml) is exactly what the code generates."""

from __future__ import annotations

import io
from pathlib import Path

import yaml
from django.core.management import call_command
from rest_framework.test import APIClient

SCHEMA = Path(__file__).resolve().parents[2] / "schema" / "openapi.yaml"


def _generated() -> str:
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    return out.getvalue()


def test_it_matches_the_committed_schema() -> None:
    assert _generated() == SCHEMA.read_text(), (
        "schema/openapi.yaml is stale: regenerate it with `python manage.py spectacular --file schema/openapi.yaml`"
    )


def test_it_serves_the_schema_publicly_as_yaml_and_json(anon: APIClient) -> None:
    as_yaml = anon.get("/api/v1/schema")
    assert as_yaml.status_code == 200
    assert as_yaml["Content-Type"].startswith("application/vnd.oai.openapi")  # the YAML media type
    assert not as_yaml.content.lstrip().startswith(b"{")
    doc = yaml.safe_load(as_yaml.content)
    assert doc["info"]["title"] == "Gantry API"
    as_json = anon.get("/api/v1/schema?format=json")
    assert as_json.status_code == 200
    assert as_json.json()["paths"].keys() == doc["paths"].keys()


def test_it_documents_every_route_with_its_errors() -> None:
    doc = yaml.safe_load(SCHEMA.read_text())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            codes = set(op["responses"])
            assert "401" in codes, f"{method.upper()} {path} does not document 401"
            assert all(not path.endswith("/") for path in doc["paths"]), path
