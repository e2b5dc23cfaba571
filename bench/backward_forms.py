"""The backward forms on this machine's cuDNN: for each form the compiler writes and the form it avoids, whether
cuDNN plans it here (on the GPU, or deviceless for --target without one) and, on a GPU, whether its outputs match
the reference. The expectations are what the deviceless planning of the installed library says in
tests/test_backward_forms.py; the JSON says where this cuDNN differs.

    python bench/backward_forms.py --json out/backward-forms.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_backward_forms import FORMS  # noqa: E402 - the forms are the test's list

import cudnn_dsl  # noqa: E402
from cudnn_dsl.target.library import answering, gpu_available  # noqa: E402
from cudnn_dsl.target.machine import environment  # noqa: E402
from dsl.diagnostics import DslError  # noqa: E402


def try_form(text: str) -> dict:
    """What this machine's cuDNN does with one graph, whole (no splitting): planned with how many candidates, and
    on a GPU whether its outputs match the reference; or why not."""
    cg = cudnn_dsl.compile(text=text, split=False)
    inst = cg.graph.instances[0]
    try:
        if not gpu_available():
            return {"plans": cg.plan("h200").plan_count, "ran": False}
        comps = cg.check(cg.allocate_inputs(dict(inst.binding)))
    except DslError as e:
        return {"plans": 0, "declined": e.diagnostics[0].message[:300]}
    except Exception as e:  # noqa: BLE001 - a plan that builds and fails at launch is a finding, not a crash
        return {"plans": -1, "failed": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"ran": True, "matches": all(c.ok for c in comps), "worst": "; ".join(str(c) for c in comps if not c.ok)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    rows = []
    for f in FORMS:
        row = {"form": f.name, "written": try_form(f.written), "avoided": try_form(f.avoided)}
        rows.append(row)
        print(f"{f.name:40} written: {_word(row['written']):28} avoided: {_word(row['avoided'])}", flush=True)
    report = {"schema_version": 1, "cudnn": str(answering()), "forms": rows, "environment": environment()}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def _word(r: dict) -> str:
    if r.get("declined"):
        return "declined"
    if r.get("failed"):
        return "fails at launch"
    if not r["ran"]:
        return f"plans ({r['plans']} candidates)"
    return "runs, matches" if r["matches"] else "runs, MISMATCH"


if __name__ == "__main__":
    main()
