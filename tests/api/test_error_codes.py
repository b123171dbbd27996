"""The error-code registry (gantry.core.errors): one class per code, the docs table generated from it."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import pytest
from django.core.management import call_command
from rest_framework import exceptions as drf

import gantry
from gantry.api import errors as api_errors
from gantry.core import errors
from gantry.core.management.commands.error_codes import api_doc, documented_table


def test_docs_api_md_holds_the_table_the_registry_generates() -> None:
    assert documented_table(api_doc().read_text()) == errors.markdown_table(), (
        "docs/api.md's error table is stale: run `python manage.py error_codes --write`"
    )


def test_every_error_class_of_the_service_is_declared_in_the_registry_module() -> None:
    # Import every module, so an error class declared anywhere else would show up as a subclass.
    for info in pkgutil.walk_packages(gantry.__path__, "gantry."):
        if ".migrations." not in info.name and not info.name.endswith(".settings"):
            importlib.import_module(info.name)
    stray = [cls for cls in _all_subclasses(errors.GantryError) if cls.__module__ != errors.__name__]
    assert stray == []


def test_each_code_belongs_to_one_class_with_a_docstring_and_an_http_error_status() -> None:
    codes = [cls.code for cls in errors.registry()]
    assert len(codes) == len(set(codes))
    for cls in errors.registry():
        assert cls.__doc__, cls
        assert 400 <= cls.http_status < 500 or cls.http_status == 503, cls


def test_two_classes_declaring_one_code_are_refused() -> None:
    class Twin(errors.Conflict):
        """A second class for an existing code."""

        code = "name_taken"

    try:
        with pytest.raises(TypeError, match="name_taken"):
            errors.registry()
    finally:
        # Forget the twin, or every later registry() would see it.
        del Twin
        import gc

        gc.collect()


def test_benign_conflicts_log_at_info_and_others_at_warning() -> None:
    assert errors.RunAlreadyTerminal.log_level == logging.INFO
    assert errors.RunAlreadyTerminal.http_status == 409
    assert errors.AcceptResponseUndeliverable.log_level == logging.WARNING


def test_retry_after_becomes_a_header() -> None:
    err = errors.Conflict("wait", retry_after=7)
    assert err.headers() == {"Retry-After": "7"}
    assert errors.Conflict("now").headers() == {}


def test_drf_exceptions_map_onto_registered_codes() -> None:
    registered = {cls.code for cls in errors.registry()}
    for theirs, ours in api_errors._FROM_DRF:
        assert issubclass(theirs, drf.APIException)
        assert ours.code in registered
        response = api_errors.exception_handler(theirs("x"), {})
        assert response is not None
        assert response.data["code"] == ours.code


def test_the_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("error_codes")
    assert capsys.readouterr().out == errors.markdown_table()


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def test_a_database_that_is_not_answering_is_a_503_with_retry_after_not_a_500() -> None:
    from django import db

    response = api_errors.exception_handler(db.OperationalError("connection refused"), {})
    assert response is not None
    assert response.status_code == 503
    assert response.data["code"] == "service_unavailable"
    assert response["Retry-After"] == "1"
