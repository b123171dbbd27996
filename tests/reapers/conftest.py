"""Reaper fixtures: the live-log flush seam recorded instead of writing to storage."""

from __future__ import annotations

import uuid

import pytest

import gantry.logs


class FlushRecorder:
    """Stands in for ``gantry.logs.flush_live_log``; can be told to fail."""

    def __init__(self) -> None:
        self.calls: list[uuid.UUID] = []
        self.fail_next = 0

    def __call__(self, run_id: uuid.UUID) -> bool:
        self.calls.append(run_id)
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("log storage unavailable")
        return True


@pytest.fixture
def flushed(monkeypatch: pytest.MonkeyPatch) -> FlushRecorder:
    recorder = FlushRecorder()
    monkeypatch.setattr(gantry.logs, "flush_live_log", recorder)
    return recorder
