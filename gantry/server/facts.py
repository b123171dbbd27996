"""What the fast lane learns from Django at start-up, instead of copying it (gantry.server.lane).

- **Where each hot view is routed.** Its URL pattern is found in the URL
  configuration by the view's class; the lane matches a path with the
  patterns' own regexes (joined along the include chain) and binds the ids
  with their own converters. A view that is not routed, is routed twice, is
  shadowed by an earlier pattern, or is reached through something the lane
  does not read (a locale prefix, positional or extra arguments) turns its
  route off, with the reason logged.
- **What the middleware makes of each answer.** The configured stack
  (``settings.MIDDLEWARE``, loaded as Django's handler loads it) runs over a
  synthetic request of the route whose view returns the lane's canned answer,
  for each answer shape the route gives (status, JSON or empty). What comes
  out (the headers, where Content-Length goes, the request metric's series)
  is what the lane adds to its answers. A stack that changes the status or
  the body, redirects or refuses, sets a cookie, or answers differently for
  another body of the shape or over https turns the route off.
- **The host check**: ``HttpRequest.get_host()`` itself (ALLOWED_HOSTS,
  DEBUG's defaults, USE_X_FORWARDED_HOST), remembered per header value.

What the probe cannot see: an effect that depends on request headers other
than those its request carries (a runner's: Host, Authorization, Accept,
Content-Type and -Length, Accept-Encoding, User-Agent), or a middleware's
side effects beyond the answer and the request metric.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from a2wsgi.wsgi import build_environ
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.base import BaseHandler
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, resolve, reverse
from django.urls.resolvers import RegexPattern, RoutePattern

from gantry.web.http_metrics import REQUEST_SECONDS

Header = tuple[bytes, bytes]
JSON = b"application/json"


class Off(Exception):
    """Why one of the lane's routes is off: Django answers its calls (logged once at start)."""


# ---------------------------------------------------------------- routes


@dataclass(frozen=True)
class Binding:
    """Where a view is in the URL configuration, as the lane matches it."""

    regex: re.Pattern[str]  # the whole path: the include chain's patterns, joined
    converters: tuple[tuple[str, Callable[[str], Any]], ...]  # (id name, its converter's to_python)
    tail: str  # the path's last segment, literal in the pattern: the lane's dispatch key
    label: str  # the matched route (``api/v1/runs/<uuid:run_id>/status``): the request metric's label
    sample: str  # a path Django resolves to the view (the probe's)

    def ids(self, path: str) -> dict[str, Any] | None:
        """The path's ids as the view receives them, or None when the pattern does not match it."""
        found = self.regex.fullmatch(path)
        if found is None:
            return None
        try:
            return {name: to_python(found[name]) for name, to_python in self.converters}
        except ValueError:
            return None  # as RoutePattern.match: no match, Django's 404

    @property
    def literal(self) -> str | None:
        """The one path the pattern matches, when it has no parameters."""
        return self.sample if not self.converters else None


def view_class(callback: Any) -> Any:
    # Django's View.as_view sets view_class; DRF's APIView.as_view also cls.
    return getattr(callback, "view_class", None) or getattr(callback, "cls", None)


def _chains(resolver: URLResolver, chain: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    """Each URLPattern with the resolvers above it, root first."""
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _chains(entry, (*chain, entry))
        elif isinstance(entry, URLPattern):
            yield (*chain, entry)


def bind(view: type, ids: Sequence[str], sample_id: Any) -> Binding:
    """The view's one URL pattern, read for the lane; raises Off when the lane cannot answer for it exactly.

    ``ids``: the path parameters the lane's handler reads; ``sample_id`` a
    value of theirs, to build a path Django must resolve to this view.
    """
    name = view.__name__
    root = get_resolver()
    found = [c for c in _chains(root, (root,)) if view_class(c[-1].callback) is view]
    if len(found) != 1:
        raise Off(f"{name} is in {len(found)} URL patterns, not one")
    chain = found[0]
    parts: list[str] = []
    converters: dict[str, Any] = {}
    for node in chain:
        pattern = node.pattern
        # The route or regex as written: a lazy (translated) one depends on the language.
        source = getattr(pattern, "_route" if isinstance(pattern, RoutePattern) else "_regex", None)
        if not isinstance(pattern, (RoutePattern, RegexPattern)) or not isinstance(source, str):
            raise Off(f"{name}'s path goes through {pattern!r}, which depends on the language")
        if getattr(node, "default_kwargs", None) or getattr(node, "default_args", None):
            raise Off(f"{name}'s URL configuration passes extra arguments to it")
        level = pattern.regex.pattern
        if not level.startswith("^"):
            raise Off(f"{name}'s path goes through an unanchored pattern ({level!r})")
        # Each level matches from where the one above stopped (Django's search
        # from ^); the last ends at the path's end (its own \Z or $, under fullmatch).
        parts.append(f"(?:{level[1:]})")
        converters.update(getattr(pattern, "converters", {}))
    regex = re.compile("".join(parts))
    if regex.groups != len(regex.groupindex) or set(regex.groupindex) != set(ids):
        raise Off(f"{name}'s path binds {sorted(regex.groupindex)} (and {regex.groups} groups), not {sorted(ids)}")
    if not set(ids) <= set(converters):
        raise Off(f"{name}'s path parameters have no converter")
    callback = chain[-1].callback
    try:
        sample = reverse(callback, kwargs=dict.fromkeys(ids, sample_id))
    except NoReverseMatch as exc:
        raise Off(f"{name}'s path cannot be built: {exc}") from None
    tail = sample.rsplit("/", 1)[-1]
    last = str(chain[-1].pattern)
    if not re.fullmatch(r"[A-Za-z0-9_.~-]+", tail) or not re.search(rf"(?:^|/|\^){re.escape(tail)}(?:\$|\\Z)?$", last):
        raise Off(f"{name}'s path does not end in a literal segment ({last!r})")
    match = resolve(sample)
    if match.func is not callback:
        raise Off(f"{sample} resolves to {match.func!r}, not {name}: an earlier pattern takes its paths")
    binding = Binding(regex, tuple((key, converters[key].to_python) for key in ids), tail, match.route, sample)
    if binding.ids(sample) != match.kwargs or match.args:
        raise Off(f"the lane reads {sample} as {binding.ids(sample)}, Django as {match.args} {match.kwargs}")
    if match.kwargs != dict.fromkeys(ids, sample_id):
        raise Off(f"{name}'s path parameters are not read as {type(sample_id).__name__} ({match.route!r})")
    return binding


# ---------------------------------------------------------------- the host check


def host_check() -> Callable[[bytes | None, bytes | None], bool]:
    """``ok(host, forwarded_host)``: whether Django's get_host() accepts the request's Host (and
    X-Forwarded-Host, read only under USE_X_FORWARDED_HOST), remembered per value (up to 64 of them)."""
    forwarded_counts = bool(settings.USE_X_FORWARDED_HOST)
    seen: dict[Any, bool] = {}

    def ok(host: bytes | None, forwarded: bytes | None = None) -> bool:
        key = (host, forwarded) if forwarded_counts else host
        known = seen.get(key)
        if known is None:
            known = _get_host_ok(host, forwarded if forwarded_counts else None)
            if len(seen) < 64:
                seen[key] = known
        return known

    return ok


def _get_host_ok(host: bytes | None, forwarded: bytes | None) -> bool:
    if host is None:
        return False  # HTTP/1.0 without Host: Django builds one from the server's name; not the lane's
    request = HttpRequest()
    request.META["HTTP_HOST"] = host.decode("latin-1")
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_HOST"] = forwarded.decode("latin-1")
    try:
        request.get_host()
    except DisallowedHost:
        return False
    return True


def probe_host() -> str:
    """A Host value Django accepts, for the probe's request; raises Off when there is none to try."""
    ok = host_check()
    candidates = [entry.lstrip(".") for entry in settings.ALLOWED_HOSTS if entry != "*"]
    for host in [*candidates, "localhost", "127.0.0.1"]:
        if host and ok(host.encode(), None):
            return host
    raise Off("no host name passes ALLOWED_HOSTS")


# ---------------------------------------------------------------- the middleware's answers


@dataclass(frozen=True)
class Shape:
    """The headers a route's answer of one shape carries, the view's and the middleware's, in their order."""

    before: tuple[Header, ...]  # up to Content-Length
    after: tuple[Header, ...]
    length: bool  # whether the middleware adds Content-Length (filled per answer)
    # The request metric's series the middleware observes for it (labels in the
    # metric's order), or None when it observes none.
    timed: tuple[str, ...] | None

    def headers(self, body: bytes) -> list[Header]:
        if not self.length:
            return [*self.before, *self.after]
        return [*self.before, (b"content-length", str(len(body)).encode()), *self.after]


class _Probe(BaseHandler):
    """Django's handler with the configured middleware, whose view is the canned answer of the moment."""

    def __init__(self) -> None:
        self.answer: Callable[[], HttpResponse] = HttpResponse
        self.load_middleware()

    def resolve_request(self, request: HttpRequest) -> Any:
        # The real resolution (request.resolver_match, its route and kwargs,
        # as a real request has them), with the view swapped for the canned
        # answer, which carries the view's attributes (csrf_exempt, view_class)
        # for middleware that reads them.
        match = super().resolve_request(request)
        real, answer = match.func, self.answer

        def canned(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return answer()

        canned.__dict__.update({k: v for k, v in real.__dict__.items() if k != "__wrapped__"})
        match.func = canned
        return match

    def make_view_atomic(self, view: Any) -> Any:
        return view  # the canned answer touches no database (ATOMIC_REQUESTS would open a transaction)


def shapes(
    binding: Binding, *, method: str, allow: bytes, answers: Sequence[tuple[int, bool]], body: bool
) -> dict[tuple[int, bool], Shape]:
    """What the configured middleware makes of each of the route's answers (status, JSON or not); raises Off.

    Each shape runs over http and https, with two bodies of it (JSON: two of
    different lengths; empty: twice), and must come out the same every time:
    a header that depends on the body, the scheme or the moment cannot be
    reproduced. The probe's observations of the request metric are withdrawn.
    """
    handler = _Probe()
    host = probe_host()
    out = {}
    for status, is_json in answers:
        bodies = [json.dumps({"probe": "x" * n}).encode() for n in (256, 300)] if is_json else [b"", b""]
        seen = set()
        for scheme in ("http", "https"):
            for answer in bodies:
                seen.add(_probe(handler, binding, method=method, allow=allow, status=status, body=answer,
                                scheme=scheme, host=host, request_body=b"{}" if body else b""))  # fmt: skip
        if len(seen) != 1:
            raise Off(f"the middleware's headers on a {status} vary with the body, the scheme or the moment")
        out[(status, is_json)] = seen.pop()
    return out


def _probe(
    handler: _Probe, binding: Binding, *, method: str, allow: bytes, status: int, body: bytes, scheme: str,
    host: str, request_body: bytes,
) -> Shape:  # fmt: skip
    def answer() -> HttpResponse:
        response = HttpResponse(body, status=status, content_type=JSON.decode())
        if not body:
            del response["Content-Type"]  # as DRF's Response answers an empty body
        response["Allow"] = allow.decode()
        return response

    headers = [
        (b"host", host.encode()),
        (b"authorization", b"Bearer probe"),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"user-agent", b"gantry-lane-probe"),
    ]
    if request_body:
        headers += [(b"content-type", JSON), (b"content-length", str(len(request_body)).encode())]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": scheme,
        "path": binding.sample, "raw_path": binding.sample.encode(), "query_string": b"", "root_path": "",
        "headers": headers, "client": ("127.0.0.1", 0), "server": (host, 443 if scheme == "https" else 80),
    }  # fmt: skip
    request = WSGIRequest(build_environ(scope, io.BytesIO(request_body)))  # type: ignore[arg-type]
    handler.answer = answer
    before = _metric_counts()
    # The middleware chain itself, not get_response(): no request signals (they
    # would close database connections) and no "Internal Server Error" log for
    # the probe of a 500.
    response = handler._middleware_chain(request)  # type: ignore[attr-defined]  # set by load_middleware()
    timed = _withdraw(before)
    what = f"{method} {binding.sample} ({status}, {scheme})"
    if response.status_code != status:
        where = f" to {response['Location']}" if response.has_header("Location") else ""
        raise Off(f"the middleware answers {what} with {response.status_code}{where}")
    if response.streaming or response.content != body:
        raise Off(f"the middleware changes the body of {what}")
    if response.cookies:
        raise Off(f"the middleware sets a cookie on {what}")
    if len(timed) > 1:
        raise Off(f"the middleware records {what} in the request metric more than once")
    items = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    lengths = [i for i, (k, _) in enumerate(items) if k == b"content-length"]
    if lengths and items[lengths[0]][1] != str(len(body)).encode():
        raise Off(f"the middleware sets a Content-Length other than the body's on {what}")
    cut = lengths[0] if lengths else len(items)
    return Shape(tuple(items[:cut]), tuple(items[cut + 1 :]), bool(lengths), timed[0] if timed else None)


def _metric_counts() -> dict[tuple[str, ...], float]:
    """The request metric's observation count per series (label values in the metric's order)."""
    return {
        tuple(sample.labels.values()): sample.value
        for family in REQUEST_SECONDS.collect()
        for sample in family.samples
        if sample.name.endswith("_count")
    }


def _withdraw(before: dict[tuple[str, ...], float]) -> list[tuple[str, ...]]:
    """The series the probe observed; those it created are removed again (a series that existed before,
    only in a process that served requests before the lane started, keeps the probe's observation)."""
    observed = [key for key, count in _metric_counts().items() if count > before.get(key, 0.0)]
    for key in observed:
        if key not in before:
            REQUEST_SECONDS.remove(*key)
    return observed
