"""Kubernetes label selectors (``a=b,c!=d,e in (f,g),h notin (i),j,!k``), for the fake API server."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Labels = Mapping[str, str]
SET = re.compile(r"^(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)$")
COMPARE = re.compile(r"^(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)$")
EXISTS = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)$")


def _split(selector: str) -> list[str]:
    """Split on the commas that are not inside ``( )``."""
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _requirement(text: str) -> Callable[[Labels], bool]:
    if m := SET.match(text):
        key, values = m["key"], {v.strip() for v in m["values"].split(",") if v.strip()}
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := COMPARE.match(text):
        key, value = m["key"], m["value"]
        if m["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := EXISTS.match(text):
        key = m["key"]
        if m["neg"]:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ValueError(f"{text!r} is not a label selector requirement")


def parse_selector(selector: str) -> Callable[[Labels], bool]:
    """A predicate over a label map; the empty selector matches everything."""
    requirements = [_requirement(part) for part in _split(selector)]
    return lambda labels: all(req(labels) for req in requirements)
