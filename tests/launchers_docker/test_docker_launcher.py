"""The Docker launcher driven directly, against the real engine: the token hand-over, labels, discover, keep.

The runners here talk to a real Gantry server (tests/e2e's) with a token the
server refuses, or to a port where nothing listens: either way the container
does what a runner does with its credentials, and nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import io
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from docker.errors import NotFound

from launchers.base import Assignment, LaunchError
from launchers.docker import LABEL_GROUP, LABEL_MANAGED, LABEL_RUN, LABEL_RUNNER, DockerLauncher, DockerOptions
from tests.e2e.conftest import Server, wait_until
from tests.launchers_docker.conftest import RUNNER_IMAGE, remove_containers
from tests.ports import free_port

pytestmark = pytest.mark.docker


@pytest.fixture
def groups(docker_client: Any) -> Iterator[list[str]]:
    """Group ids for launchers of this test (random: the engine is shared); their containers go at the end."""
    made: list[str] = []
    yield made
    remove_containers(docker_client, made)


def launcher(groups: list[str], **options: Any) -> DockerLauncher:
    made = DockerLauncher(DockerOptions(image=RUNNER_IMAGE, network="host", pull="never", **options))
    made.group_id = f"test-{secrets.token_hex(6)}"
    groups.append(made.group_id)
    return made


def assignment(server: str, token: str = "") -> Assignment:
    return Assignment(
        server=server,
        run_id=str(uuid.uuid4()),
        runner_id=str(uuid.uuid4()),
        runner_token=token or f"secret-{secrets.token_hex(16)}",
    )


def nowhere() -> str:
    """A server URL where nothing listens: the runner retries ready there (for 30 s), so it keeps running."""
    return f"http://127.0.0.1:{free_port()}"


def test_the_token_is_handed_over_as_a_file_the_runner_reads_deletes_and_never_shows(
    server: Server, docker_client: Any, groups: list[str]
) -> None:
    docker_launcher = launcher(groups)
    job = assignment(server.url)
    handle = docker_launcher.launch(job)
    wait_until(lambda: not docker_launcher.is_alive(handle), 60, "the runner to be refused and exit")

    container = docker_client.containers.get(handle.meta["container_id"])
    inspected = str(docker_client.api.inspect_container(container.id))
    assert job.runner_token not in inspected
    assert container.labels == {
        LABEL_MANAGED: "true",
        LABEL_GROUP: docker_launcher.group_id,
        LABEL_RUN: job.run_id,
        LABEL_RUNNER: job.runner_id,
    }
    lines = docker_launcher.last_lines(handle)
    # It read the token (and the server refused it: a made-up one), rather than finding none.
    assert any('"event": "runner.refused"' in line and "ready refused" in line for line in lines), lines
    assert not any(job.runner_token in line for line in lines)
    with pytest.raises(NotFound):
        container.get_archive("/tmp/gantry-runner-token")  # deleted once read

    assert docker_launcher.reap(handle) == 2  # the runner's "credentials refused"
    with pytest.raises(NotFound):
        docker_client.containers.get(container.id)


def test_an_image_whose_user_has_a_name_still_gets_a_token_it_can_read(
    server: Server, docker_client: Any, groups: list[str]
) -> None:
    tag = f"gantry-runner-test:named-{secrets.token_hex(4)}"
    dockerfile = f"FROM {RUNNER_IMAGE}\nUSER runner\n".encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, network_mode="none")
    try:
        docker_launcher = DockerLauncher(DockerOptions(image=tag, network="host", pull="never"))
        docker_launcher.group_id = f"test-{secrets.token_hex(6)}"
        groups.append(docker_launcher.group_id)
        handle = docker_launcher.launch(assignment(server.url))
        wait_until(lambda: not docker_launcher.is_alive(handle), 60, "the runner to be refused and exit")
        lines = docker_launcher.last_lines(handle)
        assert any('"event": "runner.refused"' in line for line in lines), lines
        assert docker_launcher.reap(handle) == 2
    finally:
        docker_client.images.remove(tag, force=True)


def test_discover_finds_only_its_own_groups_containers(docker_client: Any, groups: list[str]) -> None:
    mine, theirs = launcher(groups), launcher(groups)
    my_handle = mine.launch(assignment(nowhere()))
    their_handle = theirs.launch(assignment(nowhere()))

    # A coordinator restart is a new launcher on the same engine and group.
    restarted = launcher(groups)
    restarted.group_id = mine.group_id
    [found] = restarted.discover()
    assert (found.run_id, found.runner_id, found.ident) == (my_handle.run_id, my_handle.runner_id, my_handle.ident)
    assert [h.run_id for h in theirs.discover()] == [their_handle.run_id]

    # Stopping mine (docker stop: SIGTERM, SIGKILL after the grace) leaves theirs running.
    restarted.terminate(found, grace=1)
    assert not restarted.is_alive(found)
    assert theirs.is_alive(their_handle)
    # A worker that ended while no coordinator watched is reaped by the next discover: its container goes.
    assert restarted.discover() == []
    with pytest.raises(NotFound):
        docker_client.containers.get(my_handle.meta["container_id"])
    assert [h.run_id for h in theirs.discover()] == [their_handle.run_id]


def test_keep_leaves_a_reaped_container_renamed_and_discover_passes_it_by(
    server: Server, docker_client: Any, groups: list[str]
) -> None:
    docker_launcher = launcher(groups, keep=True)
    job = assignment(server.url)
    handle = docker_launcher.launch(job)
    wait_until(lambda: not docker_launcher.is_alive(handle), 60, "the runner to exit")

    assert docker_launcher.reap(handle) == 2
    kept = docker_client.containers.get(handle.meta["container_id"])
    assert kept.name == f"gantry-{job.runner_id}-reaped"
    assert docker_launcher.discover() == []
    assert docker_client.containers.get(kept.id).name == kept.name  # neither removed nor renamed again


def test_a_container_created_but_never_started_is_removed_by_discover(docker_client: Any, groups: list[str]) -> None:
    docker_launcher = launcher(groups)
    # What a coordinator killed between create and start leaves behind.
    labels = {LABEL_MANAGED: "true", LABEL_GROUP: docker_launcher.group_id, LABEL_RUN: "r", LABEL_RUNNER: "x"}
    stale = docker_client.containers.create(RUNNER_IMAGE, labels=labels, network_mode="none")

    assert docker_launcher.discover() == []
    with pytest.raises(NotFound):
        docker_client.containers.get(stale.id)


def test_discover_passes_by_a_container_removed_while_it_lists(docker_client: Any, groups: list[str]) -> None:
    docker_launcher = launcher(groups)
    running = docker_launcher.launch(assignment(nowhere()))
    labels = {LABEL_MANAGED: "true", LABEL_GROUP: docker_launcher.group_id, LABEL_RUN: "r", LABEL_RUNNER: "x"}
    vanishing = docker_client.containers.create(RUNNER_IMAGE, labels=labels, network_mode="none")
    # The engine lists both; the SDK then inspects each. Between the two, the second is
    # removed for real (as a coordinator's reap of an exited runner removes it).
    engine = docker.from_env()
    inspect = engine.api.inspect_container

    def removed_first(container: str) -> Any:
        if container == vanishing.id:
            docker_client.api.remove_container(container, force=True)
        return inspect(container)

    engine.api.inspect_container = removed_first
    docker_launcher._client().close()
    docker_launcher._docker = engine
    try:
        [found] = docker_launcher.discover()  # not a LaunchError: nothing is wrong with the engine
    finally:
        engine.close()
    assert found.run_id == running.run_id


def test_a_launch_whose_first_answer_was_lost_is_retried_cleanly(docker_client: Any, groups: list[str]) -> None:
    docker_launcher = launcher(groups)
    job = assignment(nowhere())
    # An earlier try created the container, but its answer never reached the coordinator.
    docker_client.containers.create(
        RUNNER_IMAGE, name=f"gantry-{job.runner_id}", labels=docker_launcher.labels(job), network_mode="none"
    )

    with pytest.raises(LaunchError) as first:
        docker_launcher.launch(job)
    assert first.value.permanent is False  # the coordinator tries again
    assert "Conflict" in first.value.message or "already in use" in first.value.message
    handle = docker_launcher.launch(job)
    assert docker_launcher.is_alive(handle)
    docker_launcher.terminate(handle, grace=0)
    # Killed by a signal, the shell's way: SIGTERM if it came before the runner's handler, else SIGKILL.
    assert docker_launcher.reap(handle) in (128 + 15, 128 + 9)
