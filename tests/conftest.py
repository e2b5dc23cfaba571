"""Shared test setup: the `gpu` and `network` markers, and `--update-goldens`."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files and show their diffs")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with `pytest -m gpu` on the GPU machine)")


def pytest_collection_modifyitems(config, items):
    # Tests that download hundreds of MB from the package index run only when asked for by name.
    if "network" not in (config.getoption("markexpr") or ""):
        fetch = pytest.mark.skip(reason="installs from the package index: run with `pytest -m network`")
        for item in items:
            if "network" in item.keywords:
                item.add_marker(fetch)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def update_goldens(request):
    return request.config.getoption("--update-goldens")
