"""Shared GPU-test setup: a private plan store per test, so no test sees another's plans; and graphs
compiled whole, so that a graph cuDNN declines fails its test instead of passing through a torch
fallback (tests of splitting ask for `split=True`)."""

import pytest


@pytest.fixture
def private_store(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDNN_DSL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def whole_graphs(monkeypatch):
    """cudnn_dsl.compile defaults to `split=False` in GPU tests: they check what cuDNN computes."""
    import cudnn_dsl.api

    compile_ = cudnn_dsl.api.compile

    def whole(*args, **options):
        options.setdefault("split", False)
        return compile_(*args, **options)

    monkeypatch.setattr(cudnn_dsl.api, "compile", whole)
