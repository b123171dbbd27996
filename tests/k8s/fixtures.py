"""The ``cluster`` fixture: a fake Kubernetes API server with a kubelet, and ``KUBECONFIG`` pointing at it.

Imported by the test modules that need it (tests/k8s/conftest.py, tests/e2e/test_kubernetes.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.fake_apiserver import FakeCluster
from tests.k8s.fake_kubelet import FakeImage

ROOT = Path(__file__).resolve().parents[2]
# The runner image as the fake node has it: the repository is its working directory (Gantry's
# image has the same code at /app), with the test's Python first on PATH.
RUNNER_IMAGE = "gantry:test"
# An image that takes an hour to pull: its Pods stay Pending (ContainerCreating).
SLOW_IMAGE = "gantry:slow"
NAMESPACE = "gantry-runners"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[FakeCluster]:
    home = tmp_path / "node-home"
    home.mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
    }
    images = {
        RUNNER_IMAGE: FakeImage(workdir=ROOT, env=env),
        SLOW_IMAGE: FakeImage(workdir=ROOT, env=env, pull_seconds=3600),
    }
    with FakeCluster(tmp_path / "cluster", images=images, namespaces={"default", NAMESPACE}) as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield fake
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            for runtime in fake.kubelet.runtimes.values():
                print(f"\n--- pod {runtime.name} ---\n{fake.kubelet.log_text(runtime.name)[-4000:]}")
