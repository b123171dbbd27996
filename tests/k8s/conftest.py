"""Fixtures for the Kubernetes launcher's tests: the fake API server (tests/k8s/fixtures.py)."""

from tests.k8s.fixtures import cluster

__all__ = ["cluster"]
