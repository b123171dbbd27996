"""Helpers for driving the admin like a browser."""

from __future__ import annotations

from typing import Any

from django.urls import reverse


def url(model: str, view: str = "changelist", *args: Any) -> str:
    return reverse(f"admin:core_{model}_{view}", args=args)


def form_data(context: Any) -> dict[str, Any]:
    """The POST body a browser would send back for a rendered admin change form, unchanged."""
    data: dict[str, Any] = {}

    def add(form: Any) -> None:
        for name in form.fields:
            value = form[name].value()
            if value is None or value is False:
                continue
            data[form.add_prefix(name)] = "on" if value is True else value

    add(context["adminform"].form)
    for inline in context["inline_admin_formsets"]:
        add(inline.formset.management_form)
        for form in inline.formset.forms:
            add(form)
    return data


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]
