"""`run --dump`, `run --save-outputs` and `run --inputs-from` against a hostile directory: links planted where the
dump or the outputs are written, special files, oversized or deeply nested files and crafted scalars where it
reads; and a reproduction that fails."""

import os

import pytest
import torch
from cli_util import run_cli

SC = "graph g {\n  input a : bf16[1, 64, 64]\n  scalar s : float = 0.5\n  output y = a * s\n}\n"


@pytest.fixture
def sc(tmp_path):
    f = tmp_path / "sc.cdg"
    f.write_text(SC)
    return f


@pytest.fixture
def dumped(tmp_path, sc):
    d = tmp_path / "d"
    p = run_cli("run", sc, "--dump", d)
    assert p.returncode == 0, p.stderr
    return d


@pytest.mark.parametrize("name", ["g.manifest.json", "g.inputs.pt", "sc.cdg", "g.torch.py", "environment.json"])
def test_a_dump_never_writes_through_a_link(tmp_path, sc, name):
    d, target = tmp_path / "d", tmp_path / "precious"
    d.mkdir()
    target.write_text("precious")
    (d / name).symlink_to(target)
    p = run_cli("run", sc, "--dump", d)
    assert p.returncode == 2 and f"--dump {d}: {name} is a symbolic link" in p.stderr
    assert target.read_text() == "precious" and (d / name).is_symlink()
    assert sorted(f.name for f in d.iterdir()) == [name]  # refused before anything is written
    assert "compare" not in p.stdout and "plan" not in p.stdout  # and before the graph was planned or run


def test_a_second_dump_of_the_graph_is_refused_unless_forced(sc, dumped):
    before = (dumped / "g.inputs.pt").read_bytes()
    p = run_cli("run", sc, "--dump", dumped, "--seed", "3")
    assert p.returncode == 2 and "already holds a dump of this graph" in p.stderr and "--force" in p.stderr
    assert (dumped / "g.inputs.pt").read_bytes() == before
    p = run_cli("run", sc, "--dump", dumped, "--seed", "3", "--force")
    assert p.returncode == 0, p.stderr
    assert (dumped / "g.inputs.pt").read_bytes() != before
    assert run_cli("run", sc, "--force").returncode == 2


def test_a_forced_dump_leaves_none_of_the_dump_it_replaces(sc, dumped):
    (dumped / "g.outputs.pt").write_bytes((dumped / "g.inputs.pt").read_bytes())  # as a GPU run's dump holds
    (dumped / "notes.txt").write_text("mine")
    p = run_cli("run", sc, "--dump", dumped, "--force")
    assert p.returncode == 0, p.stderr
    assert not (dumped / "g.outputs.pt").exists()  # outputs of another run would pass for this one's
    assert (dumped / "notes.txt").read_text() == "mine"  # what is not the dump's is left alone


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_inputs_from_opens_only_regular_files(sc, dumped, kind):
    m = dumped / "g.manifest.json"
    m.unlink()
    {"fifo": lambda: os.mkfifo(m), "directory": m.mkdir, "device": lambda: m.symlink_to("/dev/zero")}[kind]()
    p = run_cli("run", sc, "--inputs-from", dumped)  # a FIFO opened for reading would block here
    assert p.returncode == 1 and "g.manifest.json is not a regular file" in p.stderr


def test_inputs_from_refuses_an_oversized_tensor_file(sc, dumped):
    torch.save({"a": torch.zeros(4 << 20)}, dumped / "g.inputs.pt")  # 16 MiB for a graph of 8 KiB of bf16
    p = run_cli("run", sc, "--inputs-from", dumped)
    assert p.returncode == 1 and "g.inputs.pt is" in p.stderr and "byte limit" in p.stderr


def test_inputs_from_refuses_a_manifest_nested_too_deep(sc, dumped):
    (dumped / "g.manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    p = run_cli("run", sc, "--inputs-from", dumped)
    assert p.returncode == 1 and "g.manifest.json is not readable (JSON nested too deeply)" in p.stderr


@pytest.mark.parametrize("s", [torch.tensor([1.0, 2.0]), torch.tensor([])])
def test_a_dumped_scalar_must_hold_one_value(sc, dumped, s):
    torch.save({"a": torch.zeros(1, 64, 64, dtype=torch.bfloat16), "s": s}, dumped / "g.inputs.pt")
    p = run_cli("run", sc, "--inputs-from", dumped)
    assert p.returncode == 1 and f"the scalar 's' holds {s.numel()} values, not one" in p.stderr
    assert "sc.cdg:3:" in p.stderr  # located at the scalar's declaration


def test_a_reproduction_that_does_not_reproduce_fails(sc, dumped):
    ref = torch.load(dumped / "g.reference.pt", weights_only=True)
    torch.save({"y": ref["y"] + 1}, dumped / "g.reference.pt")
    p = run_cli("run", sc, "--inputs-from", dumped)
    assert p.returncode == 1 and "reference differ from the dump's in: y" in p.stdout


def test_saved_outputs_never_write_through_a_link(tmp_path, sc):
    """`--save-outputs DIR`: a link planted under an output's name is refused, not followed (torch.save on the
    path wrote the file it points to)."""
    d, target = tmp_path / "out", tmp_path / "precious"
    d.mkdir()
    target.write_text("precious")
    (d / "g.y.reference.pt").symlink_to(target)
    p = run_cli("run", sc, "--save-outputs", d)
    assert p.returncode == 2 and f"--save-outputs {d}: g.y.reference.pt is a symbolic link" in p.stderr, p.stderr
    assert target.read_text() == "precious" and (d / "g.y.reference.pt").is_symlink()
    assert sorted(f.name for f in d.iterdir()) == ["g.y.reference.pt"]


def test_saved_outputs_are_not_replaced_unless_forced(tmp_path, sc):
    d = tmp_path / "out"
    assert run_cli("run", sc, "--save-outputs", d).returncode == 0
    before = (d / "g.y.reference.pt").read_bytes()
    p = run_cli("run", sc, "--save-outputs", d, "--seed", "3")
    assert p.returncode == 2 and "it already holds g.y.reference.pt" in p.stderr and "--force" in p.stderr
    assert (d / "g.y.reference.pt").read_bytes() == before
    assert run_cli("run", sc, "--save-outputs", d, "--seed", "3", "--force").returncode == 0
    assert (d / "g.y.reference.pt").read_bytes() != before
