"""Local stand-ins for GitHub, on 127.0.0.1 random ports: an OIDC issuer and the REST API subset the launcher uses.

:class:`OidcIssuer` serves a discovery document and a JWKS, and signs tokens
(RS256) with a test key: for a workflow run it starts (GitHub Actions' token
endpoint, ``ACTIONS_ID_TOKEN_REQUEST_URL``), or for a test directly (:meth:`mint`).

:class:`FakeGitHub` speaks what ``launchers/github_actions/api.py`` calls:
workflow dispatch (with ``return_run_details``), get a workflow, list and get
workflow runs, cancel, and, in App mode, the repository's installation and
installation access tokens (the App JWT is verified with the App's public
key). It checks dispatch inputs against the template's declared inputs, as
GitHub does (an unexpected input is a 422). With ``actions=True`` it plays
GitHub Actions: a dispatch starts the template's steps as a local process
(bash, with the template's ``${{ inputs.* }}`` / ``${{ vars.* || ... }}``
expressions evaluated and the job's OIDC request variables set), and the run
completes with the process's exit code.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "launchers" / "github_actions" / "gantry-runner.yml"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class _Server:
    """A ThreadingHTTPServer on a free loopback port, routing to ``handle(method, path, query, headers, body)``."""

    def __init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _serve(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = dict(urllib.parse.parse_qsl(parts.query))
                status, headers, answer = outer.handle(self.command, parts.path, query, self.headers, body)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if data:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def handle(
        self, method: str, path: str, query: dict[str, str], headers: Any, body: Any
    ) -> tuple[int, dict[str, str], Any]:
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- the OIDC issuer


class OidcIssuer(_Server):
    def __init__(self) -> None:
        super().__init__()
        self.key = rsa_key()
        self.kid = "test-key-1"
        self.jwks_fetches = 0
        self._requests: dict[str, dict[str, Any]] = {}  # request token → the run's claims

    def handle(self, method: str, path: str, query: dict[str, str], headers: Any, body: Any) -> Any:
        if path == "/.well-known/openid-configuration":
            return 200, {}, {"issuer": self.url, "jwks_uri": f"{self.url}/.well-known/jwks"}
        if path == "/.well-known/jwks":
            self.jwks_fetches += 1
            public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
            return 200, {}, {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}
        if path == "/token":
            auth = str(headers.get("Authorization") or "")
            claims = self._requests.get(auth.split(" ", 1)[-1])
            if claims is None or not auth.lower().startswith("bearer "):
                return 401, {}, {"message": "bad request token"}
            return 200, {}, {"value": self.mint(aud=query.get("audience", ""), **claims)}
        return 404, {}, {"message": "Not Found"}

    def mint(self, *, key: rsa.RSAPrivateKey | None = None, kid: str | None = None, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "iat": now, "nbf": now, "exp": now + 300, "jti": secrets.token_hex(8), **claims}
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": kid or self.kid})

    def register(self, claims: dict[str, Any]) -> str:
        """A request token for ACTIONS_ID_TOKEN_REQUEST_TOKEN: tokens asked with it carry ``claims``."""
        token = secrets.token_urlsafe(16)
        self._requests[token] = claims
        return token


def run_claims(*, owner: str, repo: str, workflow_file: str, ref: str, run_id: int) -> dict[str, Any]:
    """What GitHub puts in a workflow_dispatch job's OIDC token."""
    git_ref = ref if ref.startswith("refs/") else f"refs/heads/{ref}"
    return {
        "sub": f"repo:{owner}/{repo}:ref:{git_ref}",
        "repository": f"{owner}/{repo}",
        "repository_owner": owner,
        "workflow": "gantry-runner",
        "workflow_ref": f"{owner}/{repo}/.github/workflows/{workflow_file}@{git_ref}",
        "ref": git_ref,
        "run_id": str(run_id),
        "run_attempt": "1",
        "event_name": "workflow_dispatch",
    }


# ---------------------------------------------------------------- GitHub


@dataclass
class FakeRun:
    id: int
    owner: str
    repo: str
    workflow_file: str
    ref: str
    inputs: dict[str, str]
    display_title: str
    created_at: str
    status: str = "queued"
    conclusion: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def as_json(self, base: str) -> dict[str, Any]:
        return {
            "id": self.id, "name": "gantry-runner", "display_title": self.display_title, "status": self.status,
            "conclusion": self.conclusion, "event": "workflow_dispatch", "head_branch": self.ref,
            "path": f".github/workflows/{self.workflow_file}", "created_at": self.created_at,
            "html_url": f"{base}/{self.owner}/{self.repo}/actions/runs/{self.id}",
        }  # fmt: skip


@dataclass
class Answer:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _template() -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(TEMPLATE.read_text())
    return loaded


def template_inputs() -> dict[str, dict[str, Any]]:
    doc = _template()
    on = doc.get("on") or doc.get(True)  # YAML 1.1 reads the key `on` as True
    return dict(on["workflow_dispatch"]["inputs"])


_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def evaluate(text: str, inputs: dict[str, str], variables: dict[str, str]) -> str:
    """The template's expressions: ``inputs.NAME`` and ``vars.NAME || 'default'``; anything else is refused
    (a template that grows new expressions must grow this too, not pass silently)."""

    def one(match: re.Match[str]) -> str:
        expr = match.group(1)
        m = re.fullmatch(r"inputs\.([A-Za-z_][A-Za-z0-9_]*)", expr)
        if m:
            return inputs.get(m.group(1), "")
        m = re.fullmatch(r"vars\.([A-Za-z_][A-Za-z0-9_]*)\s*\|\|\s*'([^']*)'", expr)
        if m:
            return variables.get(m.group(1)) or m.group(2)
        raise AssertionError(f"the fake Actions cannot evaluate ${{{{ {expr} }}}} in the template")

    return _EXPR.sub(one, text)


class FakeGitHub(_Server):
    """``/repos/{owner}/{repo}/...`` for the repositories and workflows added with :meth:`add_repo`."""

    def __init__(
        self, *, issuer: OidcIssuer, token: str = "", app_key: rsa.RSAPrivateKey | None = None, app_id: str = ""
    ) -> None:
        super().__init__()
        self.issuer = issuer
        self.token = token
        self.app_key = app_key
        self.app_id = app_id
        self.installation_tokens: set[str] = set()
        self.access_token_requests = 0
        self.installation_lookups = 0
        self.repos: dict[tuple[str, str], dict[str, int]] = {}  # → workflow file → id
        self.runs: dict[int, FakeRun] = {}
        self.dispatches: list[dict[str, Any]] = []  # every dispatch body that was accepted
        self.requests: list[tuple[str, str]] = []
        self.cancels: list[int] = []
        self.next_dispatch: list[Answer] = []  # answers for the next dispatches, before the normal one
        self.run_details = "return"  # "return" | "refuse" (422, like an old GHES) | "ignore" (204)
        self.actions = False
        self.actions_env: dict[str, str] = {}
        self.variables: dict[str, str] = {}
        self.workdir: Path | None = None
        self._ids = iter(range(7_000_000, 8_000_000))
        self._lock = threading.Lock()

    def add_repo(self, owner: str, repo: str, workflow_file: str = "gantry-runner.yml", workflow_id: int = 161) -> None:
        self.repos.setdefault((owner.lower(), repo.lower()), {})[workflow_file] = workflow_id

    # ------------------------------------------------------------ auth

    def _authorized(self, headers: Any) -> bool:
        auth = str(headers.get("Authorization") or "")
        _, _, value = auth.partition(" ")
        if self.token:
            return value == self.token
        return value in self.installation_tokens

    def _app_jwt_ok(self, headers: Any) -> bool:
        auth = str(headers.get("Authorization") or "")
        if self.app_key is None or not auth.startswith("Bearer "):
            return False
        try:
            claims = jwt.decode(auth[7:], self.app_key.public_key(), algorithms=["RS256"])
        except jwt.PyJWTError:
            return False
        return str(claims.get("iss")) == self.app_id

    # ------------------------------------------------------------ routing

    def handle(self, method: str, path: str, query: dict[str, str], headers: Any, body: Any) -> Any:
        with self._lock:
            self.requests.append((method, path))
        if method == "POST" and (m := re.fullmatch(r"/app/installations/(\d+)/access_tokens", path)):
            if not self._app_jwt_ok(headers):
                return 401, {}, {"message": "A JSON web token could not be decoded"}
            self.access_token_requests += 1
            token = "ghs_" + secrets.token_urlsafe(20)
            self.installation_tokens.add(token)
            expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            return 201, {}, {"token": token, "expires_at": expires}
        m = re.fullmatch(r"/repos/([^/]+)/([^/]+)(/.*)", path)
        if m is None:
            return 404, {}, {"message": "Not Found"}
        owner, repo, rest = m.group(1), m.group(2), m.group(3)
        workflows = self.repos.get((owner.lower(), repo.lower()))
        if rest == "/installation":
            if not self._app_jwt_ok(headers):
                return 401, {}, {"message": "A JSON web token could not be decoded"}
            self.installation_lookups += 1
            return (200, {}, {"id": 42, "app_id": int(self.app_id)}) if workflows is not None else (
                404, {}, {"message": "Not Found"})  # fmt: skip
        if not self._authorized(headers):
            return 401, {}, {"message": "Bad credentials"}
        if workflows is None:
            return 404, {}, {"message": "Not Found"}
        if m := re.fullmatch(r"/actions/workflows/([^/]+)(/dispatches|/runs)?", rest):
            name = m.group(1)
            found = next((f for f, i in workflows.items() if name in (f, str(i))), None)
            if found is None:
                return 404, {}, {"message": "Not Found"}
            if m.group(2) == "/dispatches" and method == "POST":
                return self._dispatch(owner, repo, found, body or {})
            if m.group(2) == "/runs":
                return 200, {}, self._list(owner, repo, found, query)
            return 200, {}, {"id": workflows[found], "path": f".github/workflows/{found}", "state": "active"}
        if m := re.fullmatch(r"/actions/runs/(\d+)(/cancel)?", rest):
            run = self.runs.get(int(m.group(1)))
            if run is None:
                return 404, {}, {"message": "Not Found"}
            if m.group(2):
                return self._cancel(run)
            return 200, {}, run.as_json(self.url)
        return 404, {}, {"message": "Not Found"}

    def _dispatch(self, owner: str, repo: str, workflow_file: str, body: dict[str, Any]) -> Any:
        if self.next_dispatch:
            answer = self.next_dispatch.pop(0)
            return answer.status, answer.headers, answer.body
        declared = template_inputs()
        inputs = {str(k): str(v) for k, v in (body.get("inputs") or {}).items()}
        unexpected = sorted(set(inputs) - set(declared))
        if unexpected:
            return 422, {}, {"message": f"Unexpected inputs provided: {unexpected}"}
        missing = sorted(k for k, spec in declared.items() if spec.get("required") and k not in inputs)
        if missing:
            return 422, {}, {"message": f"Required input '{missing[0]}' not provided"}
        if not body.get("ref"):
            return 422, {}, {"message": "Invalid request: ref is required"}
        if "return_run_details" in body and self.run_details == "refuse":
            return 422, {}, {"message": 'Invalid request.\n\n"return_run_details" is not a permitted key.'}
        full = {k: str(spec.get("default", "")) for k, spec in declared.items()} | inputs
        run = FakeRun(
            id=next(self._ids), owner=owner, repo=repo, workflow_file=workflow_file, ref=str(body["ref"]),
            inputs=full, display_title=evaluate(str(_template()["run-name"]), full, self.variables),
            created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )  # fmt: skip
        with self._lock:
            self.runs[run.id] = run
            self.dispatches.append(body)
        if self.actions:
            self._start(run)
        if body.get("return_run_details") and self.run_details == "return":
            return 200, {}, {
                "workflow_run_id": run.id,
                "run_url": f"{self.url}/repos/{owner}/{repo}/actions/runs/{run.id}",
                "html_url": f"{self.url}/{owner}/{repo}/actions/runs/{run.id}",
            }  # fmt: skip
        return 204, {}, None

    def _list(self, owner: str, repo: str, workflow_file: str, query: dict[str, str]) -> dict[str, Any]:
        runs = [r for r in self.runs.values() if (r.owner, r.repo, r.workflow_file) == (owner, repo, workflow_file)]
        if query.get("status"):
            runs = [r for r in runs if r.status == query["status"]]
        if query.get("created", "").startswith(">="):
            runs = [r for r in runs if r.created_at >= query["created"][2:]]
        runs.sort(key=lambda r: r.id, reverse=True)
        per_page, page = int(query.get("per_page", 30)), int(query.get("page", 1))
        chunk = runs[(page - 1) * per_page : page * per_page]
        return {"total_count": len(runs), "workflow_runs": [r.as_json(self.url) for r in chunk]}

    def _cancel(self, run: FakeRun) -> Any:
        self.cancels.append(run.id)
        if run.status == "completed":
            return 409, {}, {"message": "Cannot cancel a workflow run that is completed."}
        if run.proc is not None and run.proc.poll() is None:
            run.proc.terminate()
        run.status, run.conclusion = "completed", "cancelled"
        return 202, {}, {}

    # ------------------------------------------------------------ test controls

    def complete(self, run_id: int, conclusion: str = "failure") -> None:
        """The workflow run ends (its job finished or crashed) without any process of ours."""
        run = self.runs[run_id]
        run.status, run.conclusion = "completed", conclusion

    # ------------------------------------------------------------ playing GitHub Actions

    def _start(self, run: FakeRun) -> None:
        assert self.workdir is not None, "set workdir before turning actions on"
        temp = self.workdir / f"run-{run.id}"
        temp.mkdir(parents=True)
        claims = run_claims(owner=run.owner, repo=run.repo, workflow_file=run.workflow_file, ref=run.ref, run_id=run.id)
        request_token = self.issuer.register(claims)
        steps = _template()["jobs"]["run"]["steps"]
        script = ["set -e"]
        for step in steps:
            env = {k: evaluate(str(v), run.inputs, self.variables) for k, v in (step.get("env") or {}).items()}
            exports = " ".join(f"{k}={_quote(v)}" for k, v in env.items())
            script.append(f"( export {exports}; {step['run']} )" if exports else f"( {step['run']} )")
        env = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(temp),
            "RUNNER_TEMP": str(temp),
            "GITHUB_RUN_ID": str(run.id),
            "ACTIONS_ID_TOKEN_REQUEST_URL": f"{self.issuer.url}/token?api-version=2.0",
            "ACTIONS_ID_TOKEN_REQUEST_TOKEN": request_token,
            **self.actions_env,
        }
        run.log = temp / "job.log"
        with open(run.log, "wb") as out:
            run.proc = subprocess.Popen(
                ["bash", "-c", "\n".join(script)], cwd=temp, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        run.status = "in_progress"
        threading.Thread(target=self._finish_when_done, args=(run,), daemon=True).start()

    def _finish_when_done(self, run: FakeRun) -> None:
        assert run.proc is not None
        code = run.proc.wait()
        if run.status != "completed":
            run.status, run.conclusion = "completed", "success" if code == 0 else "failure"

    def processes(self) -> Iterator[subprocess.Popen[bytes]]:
        for run in self.runs.values():
            if run.proc is not None:
                yield run.proc

    def close(self) -> None:
        for proc in self.processes():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        super().close()


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"
