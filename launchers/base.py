"""What every launcher is: start an ephemeral runner for a claimed run, and keep track of it.

A coordinator holds one launcher. It calls :meth:`Launcher.launch` for each
claim, :meth:`Launcher.is_alive` to see which workers finished (then
:meth:`Launcher.reap` to forget them), :meth:`Launcher.discover` at start-up
to re-attach to workers a previous coordinator process left running, and
:meth:`Launcher.terminate` to stop one. Launchers never talk to Gantry: the
runner they start does, and the coordinator reports a failed launch and
reconciles its workers with Gantry (it asks :meth:`Launcher.is_alive` every
few seconds; a launcher that learns of an exit sooner calls
:meth:`Launcher.notify_exit`, and the coordinator looks at once).

A launcher that can keep runners *warm* (``supports_warm``; the coordinator's
``--warm N``, runners.warm) also starts runners that hold no run and no
credential (:meth:`Launcher.start_warm`), hands one a claim
(:meth:`Launcher.assign_warm`, after which it is an ordinary worker), and
watches and stops the idle ones (:meth:`Launcher.warm_alive`,
:meth:`Launcher.stop_warm`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


class LaunchError(Exception):
    """A launch failed. ``permanent``: trying again cannot help (a missing binary, a refused image).

    Either way the coordinator reports the run as dispatch-failed (the run is
    claimed and only a runner could start it); a transient failure is first
    retried a few times within the assignment's lease.
    """

    def __init__(self, message: str, *, permanent: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        # Seconds the system that refused asked us to wait (a Retry-After), when it said.
        self.retry_after = retry_after


@dataclass(frozen=True)
class Assignment:
    """One claimed run and everything its runner needs to reach Gantry."""

    server: str
    run_id: str
    runner_id: str
    # The runner JWT: a secret. Kept out of repr so it never lands in a log line.
    runner_token: str = field(repr=False)
    assigned_expires_at: str = ""
    # The runner group the coordinator serves (launchers label their workers with it).
    group_id: str = ""


@dataclass
class WorkerHandle:
    """A started runner, as the launcher knows it (``ident``: a pid, container id, pod name, ...)."""

    kind: str
    run_id: str
    runner_id: str
    ident: str
    started_at: float  # epoch seconds
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class WarmWorker:
    """A runner started ahead of any claim, waiting for one: it holds no run and no credential."""

    kind: str
    ident: str
    started_at: float  # epoch seconds
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UnseenExit:
    """A worker that ended while no coordinator watched, found (and reaped) by :meth:`Launcher.discover`."""

    handle: WorkerHandle
    exit_code: int | None
    last_lines: list[str]


class Launcher(ABC):
    kind: ClassVar[str] = ""
    # Whether start_warm / assign_warm / warm_alive / stop_warm work (the coordinator's --warm).
    supports_warm: ClassVar[bool] = False
    # Set by the coordinator before the first call: the group it serves. A
    # launcher that labels its workers discovers only its own group's, so two
    # coordinators sharing a Docker host or a namespace never touch each other's.
    group_id: str = ""
    # Set by the coordinator: called without arguments, from any thread, when a
    # worker may have exited, so the worker is reaped and reported at once.
    exit_listener: Callable[[], None] | None = None

    def notify_exit(self) -> None:
        """Tell the coordinator a worker may have exited (a child's wait returned, a container's die event)."""
        if self.exit_listener is not None:
            self.exit_listener()

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, state_dir: Path) -> Launcher:
        """Build from the coordinator's ``--launcher-option KEY=VALUE`` pairs; refuse unknown keys."""
        if options:
            raise ValueError(f"launcher {cls.kind!r} takes no options (got {', '.join(sorted(options))})")
        return cls()

    @abstractmethod
    def launch(self, assignment: Assignment) -> WorkerHandle:
        """Start a runner for ``assignment``; raise :class:`LaunchError` when it cannot be started."""

    @abstractmethod
    def discover(self) -> list[WorkerHandle]:
        """The workers this launcher started (in this or an earlier process) that are still running."""

    def take_unseen_exits(self) -> list[UnseenExit]:
        """The workers :meth:`discover` found ended (and reaped), once: the coordinator reports them to Gantry,
        whose runs would otherwise wait for the inactive-runner reaper. Empty where a launcher cannot tell."""
        return []

    @abstractmethod
    def is_alive(self, handle: WorkerHandle) -> bool:
        """Whether the worker still runs."""

    @abstractmethod
    def terminate(self, handle: WorkerHandle, grace: float = 10.0) -> None:
        """Ask the worker to stop (its runner then stops its step), force it after ``grace`` seconds."""

    def reap(self, handle: WorkerHandle) -> int | None:
        """Forget a worker that is no longer alive and clean up after it; its exit code when known."""
        return None

    def startup_failure(self, handle: WorkerHandle) -> LaunchError | None:
        """A launch that was accepted but can never start its runner (an image that will not pull, a Pod
        that cannot create its container past a grace), or None while it may still start.

        The coordinator asks this of every live worker; for an answer it
        terminates and reaps the worker and reports the run as dispatch-failed
        with the error's message. Launchers whose ``launch`` only returns once
        the runner process exists never need it.
        """
        return None

    def last_lines(self, handle: WorkerHandle, limit: int = 20) -> list[str]:
        """The last ``limit`` lines the worker's runner wrote to its own output (its stdout and stderr),
        oldest first; empty when the launcher cannot tell. Read before :meth:`reap`, which may delete them:
        they go into the failure reason of a run whose worker died."""
        return []

    # ------------------------------------------------------------ warm runners (supports_warm)

    def start_warm(self) -> WarmWorker:
        """Start a runner that waits for a claim; :class:`LaunchError` when it cannot be started."""
        raise LaunchError(f"the {self.kind or type(self).__name__} launcher keeps no warm runners", permanent=True)

    def assign_warm(self, warm: WarmWorker, assignment: Assignment) -> WorkerHandle:
        """Hand ``warm`` its claim: from here on it is the worker of ``assignment``'s run, as if just launched.

        :class:`LaunchError` when the warm runner cannot take it (it died): it
        then holds nothing, and the coordinator launches the run cold.
        """
        raise LaunchError(f"the {self.kind or type(self).__name__} launcher keeps no warm runners", permanent=True)

    def warm_alive(self, warm: WarmWorker) -> bool:
        """Whether a warm runner still waits."""
        return False

    def stop_warm(self, warm: WarmWorker) -> int | None:
        """Stop a warm runner (it holds nothing: no grace is owed) and forget it; its exit code when known."""
        return None

    def warm_last_lines(self, warm: WarmWorker, limit: int = 20) -> list[str]:
        """The tail of a warm runner's own output (why it died), read before :meth:`stop_warm`; empty if unknown."""
        return []

    def close_warm(self) -> None:  # noqa: B027 - a hook: most launchers hold nothing for their warm runners
        """No more warm runners will be started (shutdown): release what starting them needed. Busy workers
        are not touched."""
