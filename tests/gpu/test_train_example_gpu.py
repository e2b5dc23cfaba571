"""The training example on the GPU (bench/train.py): each block trained through its graph's torch op,
cuDNN running the graph and its derived backward (split where cuDNN declines them whole), under
torch.compile(fullgraph=True), against the same model in plain PyTorch from the same weights."""

import pytest

from tests.helpers import load_train

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["resnet", "transformer"])
def test_training_on_cudnn_matches_plain_pytorch_under_torch_compile(name, private_store):
    train = load_train()
    # split=True: the derived backward holds ops cuDNN does not fuse into one graph (dgrad and wgrad, the
    # biases' reductions); split=False would refuse them
    # autotune=False: plain PyTorch's torch.compile in its default mode (max-autotune takes minutes)
    r = train.run_model(name, "cuda", steps=50, lr=0.05, iterations=3, compile_=True, autotune=False, split=True)
    assert r["cudnn"] is True
    assert r["dsl_trained"] == "torch.compile(fullgraph=True)", r.get("dsl_compile_error")
    assert r["losses_dsl"][-1] < r["losses_dsl"][0]  # it learns
    assert r["max_relative_difference"] < 1e-2, (r["losses_dsl"], r["losses_torch"])
    for label, t in r["step_time_us"].items():
        assert isinstance(t, float) and t > 0, (label, t)


def test_eager_training_on_cudnn_matches_plain_pytorch(private_store):
    """The same without torch.compile: the op's training path called eagerly."""
    train = load_train()
    setup = train.Setup("resnet", "cuda", split=True)
    got = train.train(setup, setup.dsl(), 10, lr=0.05)
    want = train.train(setup, setup.plain(), 10, lr=0.05)
    assert train.max_relative_difference(got, want) < 1e-2, (got, want)
