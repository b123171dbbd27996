"""The live-log flush seam: calls ``gantry.logs.flush_live_log`` when the log store provides it."""

from __future__ import annotations

import sys
import types
import uuid

import pytest

import gantry.logs
from gantry.reapers.reapers import flush_live_log_seam

from .conftest import FlushRecorder


def test_it_calls_the_log_stores_flush(flushed: FlushRecorder) -> None:
    run_id = uuid.uuid4()
    assert flush_live_log_seam(run_id) is True
    assert flushed.calls == [run_id]


def test_it_does_nothing_while_the_log_store_has_no_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gantry.logs", types.ModuleType("gantry.logs"))
    assert flush_live_log_seam(uuid.uuid4()) is False


def test_it_does_nothing_without_a_log_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gantry.logs", None)  # the import fails as if the package were absent
    assert flush_live_log_seam(uuid.uuid4()) is False


def test_it_passes_on_a_storage_error(flushed: FlushRecorder) -> None:
    flushed.fail_next = 1
    with pytest.raises(OSError, match="log storage unavailable"):
        assert flush_live_log_seam(uuid.uuid4()) is False
    assert gantry.logs.flush_live_log is flushed
