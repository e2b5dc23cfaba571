"""Shared test setup: the `gpu`, `network` and `slow` markers, and `--update-goldens`."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files and show their diffs")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with `pytest -m gpu` on the GPU machine)")


def pytest_collection_modifyitems(config, items):
    # Tests that download hundreds of MB from the package index, or take minutes, run only when asked for by name.
    asked = config.getoption("markexpr") or ""
    for marker, why in (("network", "installs from the package index"), ("slow", "takes minutes")):
        if marker not in asked:
            skip_it = pytest.mark.skip(reason=f"{why}: run with `pytest -m {marker}`")
            for item in items:
                if marker in item.keywords:
                    item.add_marker(skip_it)
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
