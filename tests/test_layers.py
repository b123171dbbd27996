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

And one module reads the server's ``GANTRY_*`` variables: ``gantry/conf.py``
(with its readers, ``gantry/env.py``); every other module asks it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

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


def test_the_core_imports_none_of_the_apps_built_on_it() -> None:
    apps = tuple(f"gantry.{app}" for app in ("dispatch", "api", "web", "logs", "reapers"))
    assert _offences("gantry/core", apps) == []


# ---------------------------------------------------------------- who reads GANTRY_* variables

# The environment readers of gantry/env.py, and os's own.
_ENV_READERS = frozenset({"envstr", "envint", "envbool", "envlist", "envseconds", "getenv"})
_CONF_MODULES = frozenset({"gantry/conf.py", "gantry/env.py"})


def _is_environ(node: ast.expr) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _gantry_name(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("GANTRY_"):
        return node.value
    return None


def _env_reads(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of every read of a literal ``GANTRY_*`` variable: ``os.environ[...]``, ``.get``, ``in``,
    ``os.getenv``, or one of gantry/env.py's readers."""
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            name = _gantry_name(node.slice)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            name = _gantry_name(node.left)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            environ_method = isinstance(func, ast.Attribute) and _is_environ(func.value)
            if called in _ENV_READERS or (environ_method and called in ("get", "pop", "setdefault")):
                name = _gantry_name(node.args[0])
        if name:
            yield node.lineno, name


def test_the_reads_are_found() -> None:
    """The control for the test below: each way of reading the environment is seen."""
    source = (
        "import os\nfrom os import environ\nfrom gantry.env import envint\n"
        "a = os.environ['GANTRY_A']\nb = os.environ.get('GANTRY_B')\nc = os.getenv('GANTRY_C')\n"
        "d = 'GANTRY_D' in os.environ\ne = envint('GANTRY_E', 1)\nf = environ.get('GANTRY_F')\n"
        "g = os.environ.get('HOME')\nh = settings.GANTRY_H\n"
    )
    assert sorted(name for _, name in _env_reads(ast.parse(source))) == [f"GANTRY_{c}" for c in "ABCDEF"]


def test_only_conf_reads_gantry_variables() -> None:
    found = []
    for path in _sources("gantry"):
        rel = str(path.relative_to(ROOT))
        if rel in _CONF_MODULES:
            continue
        for line, name in _env_reads(ast.parse(path.read_text())):
            found.append(f"{rel}:{line} {name}")
    assert found == []


# ---------------------------------------------------------------- where raw SQL lives

# A string constant that reads as an SQL statement, keywords upper case as
# Gantry writes every statement: a keyword and the shape that follows it, so
# prose that names one ("one UPDATE per run", "SELECT … LIMIT") does not
# count. Docstrings (and any other bare string expression) are prose, never sent.
_STATEMENT = re.compile(
    r"\b(SELECT\s|INSERT INTO\s|UPDATE \w+ SET\s|DELETE FROM\s|WITH \w+ AS (MATERIALIZED )?\("
    r"|CREATE (DATABASE|TABLE|INDEX)\s|ALTER TABLE\s|DROP (TABLE|INDEX)\s|SET (TIME ZONE|LOCAL|SESSION)\s)"
)
_SQL_HOME = "gantry/sql/"


def _string_constants(tree: ast.AST) -> Iterator[ast.Constant]:
    """Every string constant of ``tree`` (an f-string's literal parts too) but docstrings and bare strings."""
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node


def _statements(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in _string_constants(tree):
        found = _STATEMENT.search(node.value)
        if found:
            yield node.lineno, found.group(0).strip()


def test_the_statements_are_found() -> None:
    """The control for the tests below: statements are seen, in f-strings too; prose about SQL is not."""
    source = (
        '"""A module that sends one UPDATE per run (SELECT … LIMIT, then DELETE FROM)."""\n'
        "A = 'SELECT 1'\nB = f'SELECT {cols} FROM run'\nC = 'INSERT INTO run_event (run_id) VALUES (%s)'\n"
        "D = 'UPDATE run SET status = %s'\nE = 'DELETE FROM runner WHERE id = %s'\n"
        "F = 'WITH moved AS (SELECT 1) SELECT 2'\nG = f'CREATE DATABASE \"{name}\"'\nH = 'SET TIME ZONE {}'\n"
        "def f():\n    '''Lock the row FOR UPDATE, then SELECT it.'''\n"
        "    # SELECT id FROM run\n    log.info('the select took %s ms; update set', 3)\n"
        "I = 'run_select_idx'\nJ = 'selected'\nK = 'SET the time zone'\n"
    )
    assert sorted(line for line, _ in _statements(ast.parse(source))) == [2, 3, 4, 5, 6, 7, 8, 9]


def test_raw_sql_lives_in_gantry_sql() -> None:
    """Every raw SQL statement of the server is in gantry/sql/ (or a migration), named once (issue 22)."""
    found = []
    for path in _sources("gantry"):  # the migrations left out
        rel = str(path.relative_to(ROOT))
        if rel.startswith(_SQL_HOME):
            continue
        found += [f"{rel}:{line} {keyword}" for line, keyword in _statements(ast.parse(path.read_text()))]
    assert found == []


def test_only_the_statement_mechanism_prepares() -> None:
    """``PREPARE`` is sent by gantry/sql/statement.py alone: every prepared statement is its Statement."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "gantry").rglob("*.py"))  # the migrations too
        if str(path.relative_to(ROOT)) != "gantry/sql/statement.py"
        for node in _string_constants(ast.parse(path.read_text()))
        if "PREPARE " in node.value
    ]
    assert found == []


def test_the_bootstrap_sql_imports_the_standard_library_only() -> None:
    """gantry.embedded reads gantry/sql/bootstrap.py before Django's settings exist: it (and the package's
    ``__init__``, which importing it runs) must import neither Django nor gantry.core."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    found = [
        f"{rel}:{line} {module}"
        for rel in ("gantry/sql/__init__.py", "gantry/sql/bootstrap.py")
        for line, module in _imports(ROOT / rel)
        if module.split(".")[0] not in allowed
    ]
    assert found == []
