"""Gantry's client side as one file: the ``runners`` and ``gantry_wire`` packages as a zipapp, at a versioned URL.

A job that should run a Gantry run (the GitHub Actions workflow template,
``launchers/github_actions/gantry-runner.yml``, or any CI job) needs only
Python 3.11+ and ``curl``::

    curl -fsSL -o gantry-runner.pyz https://gantry.example.com/runner/gantry-runner.pyz
    python3 gantry-runner.pyz          # = python -m runners.ephemeral

``/runner/gantry-runner.pyz`` redirects (uncached) to
``/runner/gantry-runner-<version>.pyz``, whose version is the first 12 hex
digits of the file's sha256: the same code always has the same URL, so that
one may be cached for ever (and pinned), and a server upgrade moves it. The
``runners`` package and the shared ``gantry_wire`` it imports are
standard-library only, so the zip holds nothing else. The server finds their
files beside its own (``BASE_DIR``) rather than importing them: it never loads
the runner's code.
The archive is built once per process, byte for byte the same in every
process (sorted entries, fixed timestamps), so any web process serves the
version another one redirected to.
"""

from __future__ import annotations

import functools
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect

NAME = "gantry-runner"
# The top-level packages the zip carries, from the repository root: the runner and what it shares with the server.
PACKAGES = ("runners", "gantry_wire")
# The zip's entry point runs the runner exactly as ``python -m runners.ephemeral`` does (its
# coordinator-started and container runs), as a module name: the server imports none of it.
_MAIN = b'import runpy\n\nrunpy.run_module("runners.ephemeral", run_name="__main__", alter_sys=True)\n'
_SHEBANG = b"#!/usr/bin/env python3\n"


@dataclass(frozen=True)
class Archive:
    data: bytes
    sha256: str

    @property
    def version(self) -> str:
        return self.sha256[:12]

    @property
    def filename(self) -> str:
        return f"{NAME}-{self.version}.pyz"


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


@functools.cache
def archive() -> Archive:
    """The zipapp of this server's ``runners`` and ``gantry_wire`` (its ``__main__`` runs the ephemeral runner)."""
    root = Path(settings.BASE_DIR)
    buf = io.BytesIO()
    buf.write(_SHEBANG)
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(_entry("__main__.py"), _MAIN)
        for package in PACKAGES:
            files = sorted((root / package).glob("*.py"))
            if not files:
                raise FileNotFoundError(f"no {package}/*.py under {root}: the runner's zipapp cannot be built")
            for path in files:
                zf.writestr(_entry(f"{package}/{path.name}"), path.read_bytes())
    data = buf.getvalue()
    return Archive(data=data, sha256=hashlib.sha256(data).hexdigest())


def latest(request: HttpRequest) -> HttpResponse:
    """``/runner/gantry-runner.pyz``: a redirect to the current version's URL."""
    response = HttpResponseRedirect(f"/runner/{archive().filename}")
    response["Cache-Control"] = "no-cache"
    return response


def versioned(request: HttpRequest, version: str) -> HttpResponse:
    """``/runner/gantry-runner-<version>.pyz``: the zipapp, when ``version`` is this server's."""
    current = archive()
    if version != current.version:
        raise Http404("this server serves another version of the runner; fetch /runner/gantry-runner.pyz")
    response = HttpResponse(current.data, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{current.filename}"'
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    response["X-Checksum-Sha256"] = current.sha256
    return response
