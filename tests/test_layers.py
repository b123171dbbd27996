"""Layers that hold: which package may import which, read from the source with ``ast``.

- ``gantry_wire/`` (what the server, the runner and the launchers share)
  imports the standard library only, so any of them can carry it;
- ``launchers/`` and ``runners/`` (the client side) import nothing of the
  server, and ``launchers/`` nothing of the runner: a coordinator loads the
  launcher it runs, the shared package, and no more;
- ``gantry/`` (the server) never imports the runner: it shares values with it
  through ``gantry_wire`` and zips the runner's files by path
  (gantry/web/runner_client.py).

Every import counts, those inside functions or under ``TYPE_CHECKING`` too.
``tests/runners/test_no_server_code.py`` checks the client side again at run
time, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _sources(package: str) -> list[Path]:
    files = sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.relative_to(ROOT).parts)
    assert files, f"no Python files under {package}/"
    return files


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every module ``path`` imports; ``from a import b`` yields ``a`` and ``a.b``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the module's own package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _offences(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """Imports under ``package`` of ``forbidden`` modules (or anything inside them), as ``path:line module``."""
    found = []
    for path in _sources(package):
        for line, module in _imports(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} {module}")
    return sorted(set(found))


def test_the_shared_package_imports_the_standard_library_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "gantry_wire"}
    found = [
        f"{path.relative_to(ROOT)}:{line} {module}"
        for path in _sources("gantry_wire")
        for line, module in _imports(path)
        if module.split(".")[0] not in allowed
    ]
    assert found == []


def test_the_launchers_import_neither_the_runner_nor_the_server() -> None:
    assert _offences("launchers", ("runners", "gantry")) == []


def test_the_runner_imports_nothing_of_the_server() -> None:
    assert _offences("runners", ("gantry",)) == []


def test_the_server_never_imports_the_runner() -> None:
    assert _offences("gantry", ("runners",)) == []


# Django imports what settings name by dotted path (LOGGING's formatter,
# middleware, ...), which no import statement shows.
_RUNNER_PATH = re.compile(r"runners(\.[A-Za-z_]\w*)+")


def test_the_server_names_no_runner_module_by_dotted_path() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for path in _sources("gantry")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _RUNNER_PATH.fullmatch(node.value)
    ]
    assert found == []


@pytest.mark.xfail(strict=True, reason="issue 22: core layering, in progress on another branch")
def test_the_core_imports_none_of_the_apps_built_on_it() -> None:
    apps = tuple(f"gantry.{app}" for app in ("dispatch", "api", "web", "logs", "reapers"))
    assert _offences("gantry/core", apps) == []
