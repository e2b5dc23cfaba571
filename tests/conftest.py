"""Shared test setup: the `gpu`, `network` and `slow` markers, and `--update-goldens`."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden files and show their diffs")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with `pytest -m gpu` on the GPU machine)")


def pytest_collection_modifyitems(config, items):
    # Tests that download hundreds of MB from the package index, or take minutes, run only when asked for by name.
    asked = config.getoption("markexpr") or ""
    for marker, why in (
        ("network", "installs from the package index"),
        ("slow", "takes minutes (some need the ray extra, or cmake and c++)"),
    ):
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


@pytest.fixture(scope="session")
def ray_cluster():
    """A Ray cluster of real processes on this machine, every node on 127.0.0.1: a head of two CPUs and a node of
    one. This process is its driver."""
    import os

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: Ray's own address lookups
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from sweep_util import FAST_HEALTH, LOOPBACK

    cluster = Cluster(initialize_head=True, head_node_args={**LOOPBACK, "num_cpus": 2, "_system_config": FAST_HEALTH})
    cluster.add_node(**LOOPBACK, num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="session")
def fault_free(tmp_path_factory):
    """The sweep of sweep_util.support_spec run by the local executor without faults: its Result."""
    from sweep_util import support_spec

    from cudnn_dsl import sweep

    d = tmp_path_factory.mktemp("fault_free")
    result = sweep.run(
        sweep.plan(sweep.Spec.load(support_spec(d))), sweep.LocalExecutor(workers=2), staging=d / "staging"
    )
    assert result.complete and result.counts == {"ok": 15}, result.unfinished
    return result


@pytest.fixture(params=["local", "ray"])
def executor(request):
    """Each executor in turn: the local one (two workers), and Ray on the ray_cluster."""
    from cudnn_dsl import sweep

    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        return sweep.RayExecutor()
    return sweep.LocalExecutor(workers=2)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches empty before and after a test that compiles a model with patterns installed, and
    the checker's warnings (the patterns' NCHW graphs) silent."""
    import warnings

    import torch

    import cudnn_dsl

    torch._dynamo.reset()
    warnings.simplefilter("ignore", cudnn_dsl.DslWarning)
    yield
    torch._dynamo.reset()
