"""Plain value classes for the runner's start-up path: what ``@dataclass`` would give, without importing it.

Importing ``dataclasses`` (and ``inspect``, which it loads) and building each
class's methods with ``exec`` cost an ephemeral runner about 10 ms before its
``ready`` call (docs/runners.md, "Start-up"), a fifth of its budget. The few
value classes on that path (the client's and the runner's) declare their
fields in ``__slots__`` and write their ``__init__``; this base gives them the
``repr`` and ``==`` a dataclass has, and :class:`Frozen` its immutability.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Record:
    """``repr`` and ``==`` over the fields, like a dataclass's: the class's annotated names, in their order
    (each also in ``__slots__``); a class defining ``__eq__`` without ``__hash__`` is unhashable, as a mutable
    dataclass is."""

    __slots__ = ()
    # Fields left out of the repr (credentials), as ``field(repr=False)`` would.
    _hidden: frozenset[str] = frozenset()

    def _fields(self) -> list[str]:
        return [
            name
            for cls in reversed(type(self).__mro__)
            for name in cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - not inspect: the import this avoids
            if not name.startswith("_")
        ]

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields())

    def __repr__(self) -> str:
        shown = (f"{name}={getattr(self, name)!r}" for name in self._fields() if name not in self._hidden)
        return f"{type(self).__name__}({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()


class Frozen(Record):
    """A :class:`Record` whose fields cannot change once ``__init__`` has set them (with :meth:`_set`)."""

    __slots__ = ()

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def __hash__(self) -> int:
        return hash(self._values())
