"""The Kubernetes launcher's runner-token hand-over, run in the real runner image with the kubelet's file ownership.

The fake kubelet (tests/k8s) runs containers as the test's own user, so it
cannot show who may read what. Here the runner image runs in the machine's
Docker engine, and the two volumes are laid out as a kubelet lays them out
for a Pod whose ``fsGroup`` is the launcher's: the Secret's file owned by
root, mode 0440 with the fsGroup as its group (the launcher's ``defaultMode``
0400, plus the group read bit the kubelet adds for ``fsGroup``), mounted
read-only; the ``emptyDir`` a folder of root's with the fsGroup, mode 2777.
The init container's command runs exactly as ``pod_manifest`` writes it, as
the image's user with the fsGroup as a supplementary group (what the kubelet
gives every container of the Pod), read-only root, no capabilities.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from launchers.base import Assignment
from launchers.kubernetes_pod import TOKEN_SECRET_VOLUME, TOKEN_VOLUME, parse_options, pod_manifest
from tests.launchers_docker.conftest import RUNNER_IMAGE

pytestmark = pytest.mark.docker

TOKEN = "eyJhbGciOiJIUzI1NiJ9.handed-over.c2lnbmF0dXJl"
# runners/Dockerfile's user.
RUNNER_UID = 10001


def run(client: Any, command: list[str], volumes: dict[str, dict[str, str]], *, user: str | None = None,
        groups: list[str] | None = None) -> tuple[int, str]:  # fmt: skip
    """One container of the runner image, as a Pod's would be: its exit code and output."""
    container = client.containers.create(
        RUNNER_IMAGE, command=command, entrypoint=[], user=user, group_add=groups or [], volumes=volumes,
        read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"], network_disabled=True,
    )  # fmt: skip
    try:
        container.start()
        code = int(container.wait(timeout=60)["StatusCode"])
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def handover_mode(spec: dict[str, Any]) -> int:
    [mode] = [v["secret"]["defaultMode"] for v in spec["volumes"] if v["name"] == TOKEN_SECRET_VOLUME]
    assert isinstance(mode, int)
    return mode


def test_the_runner_token_is_handed_over_to_the_runners_user_alone_and_deleted_once_read(
    docker_client: Any, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        # Laying the files out as root's (as the kubelet does) takes root; as the docker marker does, CI fails.
        problem = "laying out the Secret's file as the kubelet does needs root (chown to uid 0)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI needs root for this test: {problem}", pytrace=False)
        pytest.skip(problem)
    options, _ = parse_options({"image": RUNNER_IMAGE}, env={})
    job = Assignment("http://127.0.0.1:9", "00000001-0000-4000-8000-000000000000",
                     "00000001-1111-4111-8111-111111111111", TOKEN, group_id="3")  # fmt: skip
    spec = pod_manifest(job, options)["spec"]
    [handover] = spec["initContainers"]
    fs_group = spec["securityContext"]["fsGroup"]
    [runner] = spec["containers"]

    secret, copy = tmp_path / "secret", tmp_path / "copy"
    secret.mkdir()
    (secret / "token").write_text(TOKEN)
    copy.mkdir()
    os.chown(copy, 0, fs_group)
    os.chmod(copy, 0o2777)
    os.chmod(tmp_path, 0o755)
    folders = {TOKEN_SECRET_VOLUME: secret, TOKEN_VOLUME: copy}
    volumes = {
        str(folders[m["name"]]): {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
        for m in handover["volumeMounts"]
    }

    # Without an fsGroup the kubelet leaves the Secret's file as defaultMode says, root's: out of reach.
    os.chown(secret / "token", 0, 0)
    os.chmod(secret / "token", handover_mode(spec))
    code, output = run(docker_client, handover["command"], volumes)
    assert code != 0
    assert "Permission denied" in output
    assert list(copy.iterdir()) == []
    # With it: group fsGroup, and the group read bit added.
    os.chown(secret / "token", 0, fs_group)
    os.chmod(secret / "token", handover_mode(spec) | 0o040)

    code, output = run(docker_client, handover["command"], volumes, groups=[str(fs_group)])
    assert code == 0, output
    [copied] = copy.iterdir()
    assert copied.read_text() == TOKEN
    assert copied.stat().st_uid == RUNNER_UID
    assert copied.stat().st_mode & 0o777 == 0o400

    # Another user of the Pod (a sidecar), even one in the fsGroup, cannot read the copy.
    [mount] = runner["volumeMounts"]
    path = f"{mount['mountPath']}/{copied.name}"
    at_runner = {str(copy): {"bind": mount["mountPath"], "mode": "rw"}}
    read = ["python3", "-c", "import sys; print(open(sys.argv[1]).read())", path]
    code, output = run(docker_client, read, at_runner, user="10002:10002", groups=[str(fs_group)])
    assert code != 0
    assert "Permission denied" in output
    # The runner reads it (as the runner does at its start) and deletes it: its steps find nothing.
    take = ["python3", "-c", "import sys; from runners.ephemeral import _token_from_file; "
            "sys.exit(_token_from_file(sys.argv[1]) != sys.argv[2])", path, TOKEN]  # fmt: skip
    code, output = run(docker_client, take, at_runner, groups=[str(fs_group)])
    assert code == 0, output
    assert list(copy.iterdir()) == []
    # The hand-over never writes over a file that is there (O_EXCL): run again, it fails and leaves it.
    (copy / "token").write_text("planted")
    code, _ = run(docker_client, handover["command"], volumes, groups=[str(fs_group)])
    assert code != 0
    assert (copy / "token").read_text() == "planted"
