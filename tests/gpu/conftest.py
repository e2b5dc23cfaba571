"""Shared GPU-test setup: a private plan store per test, so no test sees another's plans."""

import pytest


@pytest.fixture
def private_store(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
