"""A norm's epsilon and momentum carried by a declared scalar (`epsilon=eps`, `scalar eps : float[1] = 1e-5`):
the language's rules, the pass-by-value tensor cuDNN gets (the scalar's dims and uid, as the C++ frontend's
`graph.tensor(1e-5f)` makes it), the FE-JSON round trip byte for byte, the reference at the value bound per call,
the derived graphs keeping the spelling, and deviceless planning for an H200."""

import json
import re

import pytest
import torch

from cudnn_dsl.run.inputs import generate_inputs
from cudnn_dsl.run.reference import run_reference
from dsl.diagnostics import DslError
from dsl.pipeline import program


def layernorm_text(epsilon: str = "eps", decl: str = "scalar eps : float[1] = 1e-05 uid=7") -> str:
    return (
        "graph ln {\n  input x : bf16[4, 128, 256]\n  input g : float[1, 1, 256]\n  input b : float[1, 1, 256]\n"
        f"  {decl}\n  output y = layernorm(x, g, b, epsilon={epsilon})\n}}\n"
    )


BATCHNORM = """graph bn {
  input x : bf16[8, 64, 16, 16]
  input g : float[1, 64, 1, 1]
  input b : float[1, 64, 1, 1]
  input rm : float[1, 64, 1, 1]
  input rv : float[1, 64, 1, 1]
  scalar eps : float[1] = 1e-05 uid=20
  scalar mom : float[1] = 0.1 uid=21
  y, mean, inv_var, nrm, nrv = batchnorm(x, g, b, rm, rv, epsilon=eps, momentum=mom)
  output y
  output nrm
  output nrv
}
"""


def test_the_attribute_is_the_scalars_value_and_names_it():
    g = program(text=layernorm_text()).graphs[0]
    assert g.nodes[0].scalars == (("epsilon", "eps"),)
    assert g.instances[0].attrs(0)["epsilon"] == pytest.approx(1e-5)
    assert g.value("eps").dims == (1,) and g.value("eps").uid == 7
    bn = program(text=BATCHNORM).graphs[0]
    assert bn.nodes[0].scalars == (("epsilon", "eps"), ("momentum", "mom"))
    assert bn.instances[0].attrs(0)["momentum"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    "epsilon,decl,words",
    [
        ("x", "scalar eps : float = 1e-05", "attribute 'epsilon' names 'x', an input: it takes a number or a scalar"),
        ("nope", "scalar eps : float = 1e-05", "attribute 'epsilon' names 'nope', no declared scalar"),
        ("eps uid=9", "scalar eps : float[1] = 1e-05", "takes the uid of scalar 'eps': put uid= on it"),
        ("eps", "scalar eps : half[1] = 1e-05", "attribute 'epsilon' is a float; scalar 'eps' is half"),
    ],
)
def test_a_wrong_scalar_is_a_located_error(epsilon, decl, words):
    text = layernorm_text(epsilon, decl)
    with pytest.raises(DslError, match=words) as e:
        program(text=text, file="ln.cdg")
    [err] = [d for d in e.value.diagnostics if d.severity == "error"]
    assert err.loc.line == 6


def test_a_scalar_only_an_attribute_reads_is_used():
    from dsl.pipeline import load

    assert load(text=layernorm_text()).diagnostics == ()
    assert "scalar 'eps' is never used" in load(text=layernorm_text("1e-05")).diagnostics[0].message


# ---- cuDNN's tensor and the round trip ------------------------------------------------------------------


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


def frontend(text: str, target) -> dict:
    from cudnn_dsl.interop.fe_export import frontend_json

    g = program(text=text).graphs[0]
    return json.loads(frontend_json(g, g.instances[0], target))


def by_uid(j: dict) -> dict:
    tensors = j["tensors"]
    return {t["uid"]: t for t in (tensors.values() if isinstance(tensors, dict) else tensors)}


@pytest.mark.parametrize(
    "decl,want", [("scalar eps : float[1] = 1e-05 uid=7", [1]), ("scalar eps : float = 1e-05 uid=7", [1, 1, 1])]
)
def test_cudnn_gets_the_scalars_tensor(decl, want, h200):
    j = frontend(layernorm_text("eps", decl), h200)
    [node] = j["nodes"]
    assert node["inputs"]["EPSILON"] == 7
    t = by_uid(j)[7]
    assert (t["name"], t["dim"], t["stride"], t["is_pass_by_value"]) == ("eps", want, [1] * len(want), True)


@pytest.mark.parametrize("text", [layernorm_text(), BATCHNORM], ids=["layernorm", "batchnorm"])
def test_the_frontend_json_round_trip_is_byte_for_byte(text, h200):
    """Exported, imported and exported again: the same JSON, text for text (the frontend's graph id aside)."""
    from cudnn_dsl.interop.fe_export import frontend_json
    from cudnn_dsl.interop.fe_import import to_cdg, verify

    g = program(text=text).graphs[0]
    first = frontend_json(g, g.instances[0], h200)
    cdg, imported = to_cdg(first, "n.json", name=g.name)
    assert "epsilon=eps" in cdg and "scalar eps : float[1] = 1e-05 uid=" in cdg
    back = program(text=cdg, file="imported.cdg")
    verify(back, imported)
    g2 = back.graphs[0]
    again = frontend_json(g2, g2.instances[0], h200)
    no_gid = lambda s: re.sub(r'"gid": \d+', '"gid": GID', s)  # noqa: E731 - the frontend numbers its graphs
    assert no_gid(again) == no_gid(first)


def test_an_epsilon_at_the_default_dims_imports_as_a_number(h200):
    """What a number lowers to (ones at X's rank) comes back a number: existing imports are unchanged."""
    from cudnn_dsl.interop.fe_import import to_cdg

    cdg, _ = to_cdg(json.dumps(frontend(layernorm_text("1e-05"), h200)), "n.json")
    assert "epsilon=1e-05" in cdg and "scalar" not in cdg


# ---- the reference and the derived graphs ---------------------------------------------------------------


def test_the_reference_reads_the_value_bound_per_call():
    g = program(text=layernorm_text()).graphs[0]
    ins = generate_inputs(g, g.instances[0], "cpu", seed=3)
    for value in (1e-5, 0.5):
        got = run_reference(g, g.instances[0], {**ins, "eps": value}, "cpu")["y"]
        x, scale, bias = (ins[n].float() for n in ("x", "g", "b"))
        by_hand = torch.nn.functional.layer_norm(x, (256,), scale.reshape(256), bias.reshape(256), value)
        torch.testing.assert_close(got.float(), by_hand.to(torch.bfloat16).float())


def test_the_derived_graphs_keep_the_scalar():
    from dsl.autodiff import derive

    text = layernorm_text().replace("output y = layernorm", "output y = relu(layernorm").replace("eps)", "eps))")
    d = derive(program(text=text).graphs[0], avoid=lambda *a: None)
    [norm] = [n for n in d.forward.nodes if n.op == "layernorm"]
    assert norm.scalars == (("epsilon", "eps"),)
    assert d.forward.value("eps").dims == (1,)


# ---- deviceless planning ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [layernorm_text(), BATCHNORM], ids=["layernorm", "batchnorm"])
def test_h200_plans_a_norm_with_a_declared_scalar(text, h200):
    from cudnn_dsl.build.pipeline import compile_shape

    g = program(text=text).graphs[0]
    assert compile_shape(g, g.instances[0], g.options, h200).plan_count >= 1
