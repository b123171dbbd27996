"""Validation of the user-supplied shapes: run specs, label maps, secrets, a group's GitHub launcher fields.

Every JSON-stored field passes :func:`gantry.core.jsonsafe.check` first (no NUL,
no lone surrogate, bounded nesting). The size caps keep a spec something a
shell can execute: Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN;
a step's ``run`` is one argument of ``bash -c``) and a whole argument list and
environment over ARG_MAX (2 MiB with the usual 8 MiB stack), with ``E2BIG``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gantry.core import jsonsafe
from gantry.core.errors import InvalidRequest
from gantry.core.models import RESERVED_PREFIX, SELECTOR_PREFIX

MAX_STEPS = 200
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
DEFAULT_TIMEOUT_SECONDS = 3600
# A step's command line, in UTF-8 bytes: under the kernel's 128 KiB per argument.
MAX_RUN_BYTES = 96 * 1024
# A whole spec as JSON (all steps and env), and all of a stack's secrets: with
# one step's run they stay under ARG_MAX, which bounds the step's environment too.
MAX_SPEC_BYTES = 1024 * 1024
MAX_SECRETS_BYTES = 256 * 1024
# One environment value (NAME=value is one string of the environment block).
MAX_ENV_VALUE_BYTES = 96 * 1024
MAX_NAME_LENGTH = 128
# A name a step's shell can use as a variable.
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Names a spec or a secret may not set: they would break the step's shell or
# hijack what runs (the dynamic loader, bash's start-up files), or spoof the
# run's own identity (GANTRY_*, set by the runner last).
RESERVED_ENV = frozenset(
    {
        "PATH", "HOME", "SHELL", "USER", "LOGNAME", "PWD", "OLDPWD", "IFS", "ENV", "BASH_ENV", "SHELLOPTS",
        "BASHOPTS", "PS4", "PROMPT_COMMAND", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT",
    }
)  # fmt: skip
RESERVED_ENV_PREFIXES = ("GANTRY_", "BASH_FUNC_", "LD_")


def validate_env_name(name: Any, field: str) -> str:
    """A variable name a step's environment may carry: a shell identifier, not reserved."""
    if not isinstance(name, str) or not _SHELL_NAME.match(name) or len(name) > MAX_NAME_LENGTH:
        raise InvalidRequest(
            f"{field}: {name!r} is not a valid variable name (letters, digits and _, not starting with a digit, "
            f"at most {MAX_NAME_LENGTH} characters)",
            field=field,
        )
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        raise InvalidRequest(f"{field}: {name} is reserved and cannot be set", field=field)
    return name


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def validate_spec(spec: Any, *, field: str = "spec") -> dict[str, Any]:
    """Return the spec in canonical form, or raise InvalidRequest naming what is wrong.

    A spec is ``{"steps": [{"name": str, "run": str}], "env": {str: str},
    "timeout_seconds": int}``; ``env`` and ``timeout_seconds`` are optional.
    Unknown keys are refused: a misspelt ``timout_seconds`` must not silently
    become the default.
    """
    jsonsafe.check(spec, field)
    if not isinstance(spec, dict):
        raise InvalidRequest(f"{field} must be an object")
    if _utf8_len(json.dumps(spec)) > MAX_SPEC_BYTES:
        raise InvalidRequest(f"{field} is over {MAX_SPEC_BYTES} bytes as JSON", field=field)
    unknown = set(spec) - {"steps", "env", "timeout_seconds"}
    if unknown:
        raise InvalidRequest(f"{field} has unknown keys: {', '.join(sorted(unknown))}")
    steps = spec.get("steps")
    if not isinstance(steps, list) or not steps:
        raise InvalidRequest(f"{field}.steps must be a non-empty list")
    if len(steps) > MAX_STEPS:
        raise InvalidRequest(f"{field}.steps has more than {MAX_STEPS} steps")
    clean_steps = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or set(step) - {"name", "run"}:
            raise InvalidRequest(f"{field}.steps[{i}] must be an object with 'name' and 'run'")
        name, run = step.get("name"), step.get("run")
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequest(f"{field}.steps[{i}].name must be a non-empty string")
        if not isinstance(run, str) or not run.strip():
            raise InvalidRequest(f"{field}.steps[{i}].run must be a non-empty shell command")
        if _utf8_len(run) > MAX_RUN_BYTES:
            raise InvalidRequest(
                f"{field}.steps[{i}].run is over {MAX_RUN_BYTES} bytes; put a long script in a file the step runs",
                field=f"{field}.steps[{i}].run",
            )
        clean_steps.append({"name": name, "run": run})
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidRequest(f"{field}.env must map strings to strings")
    for name, value in env.items():
        validate_env_name(name, f"{field}.env")
        if _utf8_len(value) > MAX_ENV_VALUE_BYTES:
            raise InvalidRequest(f"{field}.env.{name} is over {MAX_ENV_VALUE_BYTES} bytes", field=f"{field}.env")
    timeout = spec.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= MAX_TIMEOUT_SECONDS:
        raise InvalidRequest(f"{field}.timeout_seconds must be a whole number from 1 to {MAX_TIMEOUT_SECONDS}")
    return {"steps": clean_steps, "env": dict(env), "timeout_seconds": timeout}


def _validate_label_map(labels: Any, field: str) -> dict[str, str]:
    jsonsafe.check(labels, field)
    if not isinstance(labels, dict):
        raise InvalidRequest(f"{field} must be an object of string keys and values")
    for key, value in labels.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise InvalidRequest(f"{field} must map non-empty strings to strings")
        if len(key) > 253 or len(value) > 253:
            raise InvalidRequest(f"{field}: keys and values are at most 253 characters")
    return dict(labels)


def validate_group_labels(labels: Any) -> dict[str, str]:
    """A group advertises plain capability labels; the ``gantry:`` prefix is reserved."""
    clean = _validate_label_map(labels, "labels")
    reserved = [k for k in clean if k.startswith(RESERVED_PREFIX)]
    if reserved:
        raise InvalidRequest(f"labels: keys under '{RESERVED_PREFIX}' are reserved: {', '.join(sorted(reserved))}")
    return clean


def validate_stack_labels(labels: Any) -> dict[str, str]:
    """Stack labels are free, except that under ``gantry:`` only the selector namespace is allowed."""
    clean = _validate_label_map(labels, "labels")
    bad = [k for k in clean if k.startswith(RESERVED_PREFIX) and not k.startswith(SELECTOR_PREFIX)]
    if bad:
        raise InvalidRequest(
            f"labels: under '{RESERVED_PREFIX}' only '{SELECTOR_PREFIX}<key>' is allowed: {', '.join(sorted(bad))}"
        )
    if any(k == SELECTOR_PREFIX for k in clean):
        raise InvalidRequest(f"labels: '{SELECTOR_PREFIX}' needs a key after the prefix")
    return clean


def validate_secrets(secrets: Any, *, field: str = "secrets") -> dict[str, str]:
    """Secret name → value: names as for the environment (they become variables of the steps), values strings."""
    jsonsafe.check(secrets, field)
    if not isinstance(secrets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in secrets.items()):
        raise InvalidRequest(f"{field} must map strings to strings", field=field)
    for name in secrets:
        validate_env_name(name, field)
    if sum(_utf8_len(k) + _utf8_len(v) for k, v in secrets.items()) > MAX_SECRETS_BYTES:
        raise InvalidRequest(f"{field} hold over {MAX_SECRETS_BYTES} bytes in all", field=field)
    return dict(secrets)


# ---------------------------------------------------------------- github_actions groups

GITHUB_FIELDS = ("github_owner", "github_repo", "github_workflow", "github_ref")
# GitHub's own shapes (an account, a repository, a workflow file or id), so a
# typo is a 400 at create time, not a dispatch failure at the first run.
_GITHUB_SHAPES: dict[str, tuple[re.Pattern[str], str]] = {
    "github_owner": (re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]{0,98})$"), "a GitHub user or organization name"),
    "github_repo": (re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]{1,100}$"), "a repository name"),
    "github_workflow": (
        re.compile(r"^(?:[0-9]{1,19}|[A-Za-z0-9._-]{1,190}\.ya?ml)$"),
        "a workflow file name under .github/workflows (gantry-runner.yml) or a workflow id",
    ),
    "github_ref": (
        re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)[^\s~^:?*\[\\]{1,200}(?<![/.])$"),
        "a branch or tag name (or refs/heads/..., refs/tags/...)",
    ),
}


def _field_error(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", fields={field: [message]})


def validate_github_fields(kind: str, fields: dict[str, Any]) -> dict[str, str]:
    """The group's GitHub launcher configuration, checked whole (``fields`` = the group's values after the change).

    A github_actions group needs all four; a self-hosted group takes none
    (the coordinator, not Gantry, decides how its runners start). The refusal
    names the first field at fault, in ``detail`` and in ``fields``.
    """
    clean: dict[str, str] = {}
    for name in GITHUB_FIELDS:
        value = fields.get(name) or ""
        if not isinstance(value, str):
            raise _field_error(name, "must be a string")
        clean[name] = value.strip()
    if kind != "github_actions":
        for name in GITHUB_FIELDS:
            if clean[name]:
                raise _field_error(name, "applies only to github_actions groups")
        return clean
    for name in GITHUB_FIELDS:
        pattern, what = _GITHUB_SHAPES[name]
        if not clean[name]:
            raise _field_error(name, f"is required for a github_actions group ({what})")
        if not pattern.match(clean[name]):
            raise _field_error(name, f"{clean[name]!r} is not {what}")
    return clean
