"""What the run page's "Run again" button (``web/_run_again.html``) needs, computed where the run page's view is not."""

from __future__ import annotations

from django import template

from gantry.core.models import Run
from gantry.web.stack_pages import RunAgain
from gantry.web.stack_pages import run_again_state as _state

register = template.Library()


@register.simple_tag
def run_again_state(run: Run, is_admin: bool) -> RunAgain:
    return _state(run, bool(is_admin))
