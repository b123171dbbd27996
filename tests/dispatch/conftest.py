"""The long-poll listener holds a connection to the test database; stop it before the database is dropped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gantry.dispatch import longpoll


@pytest.fixture(scope="session", autouse=True)
def _stop_longpoll_listener(django_db_setup: None) -> Iterator[None]:
    # Depends on django_db_setup, so it is torn down first: DROP DATABASE
    # refuses while the listener is still connected.
    yield
    longpoll.stop_listener()
