"""tune --exhaustive without a GPU: the space cuDNN enumerates, its order, the cap, the search record, resuming."""

from pathlib import Path

import pytest
import torch

from cudnn_dsl.build.space import KnobRange
from cudnn_dsl.tune.exhaustive import configurations, space_size
from dsl.pipeline import program

ROOT = Path(__file__).resolve().parents[1]
MATMUL = ROOT / "examples" / "plan_serialization.cdg"


def test_the_order_is_engines_in_turn_nearest_the_least_values_first():
    space = {
        0: [KnobRange("KERNEL_CFG", 0, 2, 1), KnobRange("SPLIT_K_SLC", 1, 8, 3)],  # values 1, 4, 7
        1: [],
        2: "CUDNN_STATUS_NOT_SUPPORTED",
        3: [KnobRange("TILEK", 0, 1, 1)],
    }
    got = list(configurations(space, excluded=set()))
    assert len(got) == space_size(space, set()) == 3 * 3 + 1 + 2
    assert got[:3] == [(0, {"KERNEL_CFG": 0, "SPLIT_K_SLC": 1}), (1, {}), (3, {"TILEK": 0})]  # every engine first
    zero = [k for e, k in got if e == 0]
    steps = [k["KERNEL_CFG"] + (k["SPLIT_K_SLC"] - 1) // 3 for k in zero]
    assert steps == sorted(steps) and len({tuple(k.items()) for k in zero}) == 9  # each once, nearest first
    assert [e for e, _ in configurations(space, excluded={0, 1})] == [3, 3]


@pytest.fixture(scope="module")
def h200():
    from cudnn_dsl.target.library import Target

    return Target.named("h200")


@pytest.fixture(scope="module")
def explored(h200):
    from cudnn_dsl.tune.exhaustive import search_deviceless

    g = program(MATMUL).graphs[0]
    return g, search_deviceless(g, g.instances[0], g.options, h200, cap=60)


def test_the_space_is_what_cudnn_enumerates(explored):
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.space import engine_space
    from cudnn_dsl.target.library import Target

    g, r = explored
    low = compile_shape(g, g.instances[0], g.options, Target.named("h200"), stop="check_support", tuning=True)
    assert engine_space(low) == r.space
    assert len(r.space) == low.g.get_engine_count()
    knobbed = [e for e, k in r.space.items() if isinstance(k, list)]
    assert knobbed and r.size == space_size(r.space, set()) > 60
    for e in knobbed:
        assert [(k.name, k.lo, k.hi, k.stride) for k in r.space[e]] == [
            (k.type.name, k.min_value, k.max_value, k.stride) for k in low.g.get_knobs_for_engine(e)
        ]


def test_a_capped_search_counts_what_cudnn_supports_and_says_it_stopped(explored):
    from cudnn_dsl.tune.exhaustive import report

    g, r = explored
    assert len(r.tried) == 60 and "cap of 60" in r.stopped
    heur = [t for t in r.tried if t.source == "heuristics"]
    assert heur and all(t.status == "supported" for t in heur)  # the heuristics' plans come first
    searched = [t for t in r.tried if t.source == "search"]
    assert {t.status for t in searched} <= {"supported", "unsupported"}
    supported = [t for t in searched if t.status == "supported"]
    assert supported and all(t.name.startswith(f"eng{t.engine}") for t in supported)
    assert r.left == r.size - len(searched)
    text = report(r)
    assert f"{r.size:,} engine and knob configurations" in text and "tried 60" in text
    assert f"refused {sum(t.status == 'unsupported' for t in searched)}" in text
    assert "stopped: tried the cap of 60" in text and "not built (no GPU)" in text


def test_a_search_goes_on_from_the_record_of_earlier_ones(explored, h200, tmp_path):
    """What one search tried, through the store's record, is skipped by the next, which goes on in order."""
    from cudnn_dsl.build.pipeline import compile_shape
    from cudnn_dsl.build.planner import Candidates
    from cudnn_dsl.store.files import StoreProblem
    from cudnn_dsl.store.keys import PlanKey
    from cudnn_dsl.store.plans import PlanStore
    from cudnn_dsl.tune.exhaustive import Tried, configurations, search

    g, first = explored
    store = PlanStore(tmp_path / "plans")
    key = PlanKey("0" * 64, "NVIDIA H200", "9.0", 92800, "1.32.0")
    done = [t for t in first.tried]
    for t in done:  # a record holds what a GPU search leaves: timed or refused configurations
        t.status = "unsupported" if t.status == "unsupported" else "timed"
        t.median_us = None if t.status == "unsupported" else 10.0
    store.put_search(key, g.name, [t.to_json() for t in done])
    earlier = [Tried.from_json(d) for d in store.get_search(key)]
    assert [t.key for t in earlier] == [t.key for t in done]
    low = compile_shape(g, g.instances[0], g.options, h200, stop="check_support", tuning=True)
    second = search(Candidates(None, low, g.options), earlier, set(), cap=20)
    mine = [t for t in second.tried if not t.earlier]
    assert len(mine) == 20 and not {t.key for t in mine} & {t.key for t in earlier}
    order = [(e, tuple(sorted(k.items()))) for e, k in configurations(first.space, set())]
    searched = [t.key for t in done if t.source == "search"] + [t.key for t in mine]
    assert searched == order[: len(searched)]  # the two searches together: the space's own order, unbroken
    (tmp_path / "searches" / f"{key.id}.json").write_text('{"format": 1, "tried": 3}')
    with pytest.raises(StoreProblem, match="search record"):
        store.get_search(key)


def test_excluded_engines_are_not_searched(h200):
    from cudnn_dsl.tune.exhaustive import search_deviceless

    g = program(MATMUL).graphs[0]
    opts = g.options.with_values({"exclude_engines": [0, 1, 2, 3]})
    r = search_deviceless(g, g.instances[0], opts, h200, cap=15)
    assert all(t.engine not in (0, 1, 2, 3) for t in r.tried)


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU (tests/gpu has the rest)")
def test_tune_exhaustive_without_a_gpu_asks_cudnn_for_the_target():
    from cli_util import run_cli

    p = run_cli("tune", "--exhaustive", "--max-configs", "30", "--top-k", "3", MATMUL)
    assert p.returncode == 0, p.stderr
    assert "asking cuDNN which configurations it supports for NVIDIA H200" in p.stderr
    assert "exhaustive search over" in p.stdout and "tried 30" in p.stdout
    p = run_cli("tune", "--budget", "5", MATMUL)
    assert p.returncode == 2 and "--budget goes with --exhaustive" in p.stderr
    p = run_cli("tune", "--exhaustive", "--max-configs", "0", MATMUL)
    assert p.returncode == 2 and "--max-configs must be at least 1" in p.stderr


def test_a_search_record_is_checked_like_a_plan_entry_and_cleared_with_the_store(tmp_path):
    import json

    from cudnn_dsl.store.files import StoreProblem
    from cudnn_dsl.store.keys import PlanKey
    from cudnn_dsl.store.plans import PlanStore

    store = PlanStore(tmp_path / "plans")
    key = PlanKey("0" * 64, "NVIDIA H200", "9.0", 92800, "1.32.0", "deterministic")
    other = PlanKey("1" * 64, "NVIDIA H200", "9.0", 92800, "1.32.0")
    assert store.get_search(key) == []
    good = {"engine": 4, "knobs": {"KERNEL_CFG": 3}, "source": "search", "status": "timed", "median_us": 12.5}
    store.put_search(key, "g", [good])
    assert store.get_search(key) == [good]
    path = store.search_path(key)
    for bad, why in (
        ({**good, "status": "great"}, "status"),
        ({**good, "engine": -1}, "engine"),
        ({**good, "knobs": {"KERNEL_CFG": "3"}}, "knobs"),
        ({**good, "extra": 1}, "unknown field"),
    ):
        store.put_search(key, "g", [bad])
        with pytest.raises(StoreProblem, match=why):
            store.get_search(key)
    store.put_search(key, "g", [good])
    d = json.loads(path.read_text())
    d["key"] = other.to_json()
    path.write_text(json.dumps(d))
    with pytest.raises(StoreProblem, match="another key"):
        store.get_search(key)
    assert store.clear().searches == 1 and not path.exists()
