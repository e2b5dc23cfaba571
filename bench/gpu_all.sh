#!/usr/bin/env bash
# Everything this project runs on the GPU machine, in one go. Usage, from the repo root:
#   OUT=out bash bench/gpu_all.sh
# Leaves in $OUT: pytest_gpu.txt, log.txt (every report), bench.json/.png, bench-cold.json, tune.json/.png,
# reuse.json, eject.json, torch_op.json, partition_time.json, patterns.json, library_ops.json, models.json. Plans go
# to a private store, so the run starts cold.
# GPU_TESTS=paths runs only those test files; GPU_TESTS=none runs no test. MODELS_ARGS narrows bench/models.py
# (e.g. "--models resnet50 --contenders eager,default,default+cudnn"). ONLY=names runs only those sections (comma
# separated, from SECTIONS below), so that the whole can run in pieces where one command's time is short; bench and
# sweep compare with tune's plans and results of the same run (its plan store is its own): name them with tune.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDNN_DSL_CACHE_DIR="${TMPDIR:-/tmp}/cudnn-dsl-gpu-all-$$"
LOG="$OUT/log.txt"
cdsl() { python3 -m cudnn_dsl "$@"; }
SECTIONS=tests,examples,reuse,tune,bench,eject,torch_op,partition,patterns,library_ops,models,bmm,sweep
for s in ${ONLY//,/ }; do
  [[ ",$SECTIONS," == *",$s,"* ]] || { echo "ONLY: no section '$s'; the sections are $SECTIONS" >&2; exit 2; }
done
want() { [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$1,"* ]]; }
section() { printf '\n== %s\n' "$*" | tee -a "$LOG"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOG"
if want tests && [ "${GPU_TESTS:-tests}" != none ]; then
  section "pytest -m gpu ${GPU_TESTS:-tests}"
  timeout 300 python3 -m pytest -m gpu -q -rfEx ${GPU_TESTS:-tests} -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1
  tail -2 "$OUT/pytest_gpu.txt" | tee -a "$LOG"
fi
cdsl cache clear > /dev/null  # some GPU tests use the default store: start the runs cold
if want examples; then
section "cudnn-dsl run, every example (cold store)"
for f in examples/*.cdg; do cdsl run "$f"; done >> "$LOG" 2>&1
cdsl run examples/cuda_graph_conv.cdg --cuda-graph >> "$LOG" 2>&1
grep -cE "compare .*: ok" "$LOG" | sed 's/^/outputs matching the reference: /' | tee -a "$LOG"
grep -E "MISMATCH|error" "$LOG" || true
fi
if want reuse; then
section "bench/reuse.py"
timeout 240 python3 bench/reuse.py --json "$OUT/reuse.json" 2>&1 | tee -a "$LOG" | tail -26
fi
if want tune; then
section "cudnn-dsl tune"
cdsl tune examples/conv_bias_relu.cdg examples/matmul_epilogue.cdg examples/sdpa.cdg examples/plan_serialization.cdg \
  --plot "$OUT/tune.png" --json "$OUT/tune.json" >> "$LOG" 2>&1 || echo "tune failed"
grep -E "^graph|winner|first choice" "$LOG" | grep -A2 "plans, " | tail -12
fi
if want bench; then
section "cudnn-dsl bench (tuned plans from the store)"
cdsl bench examples/conv_bias_relu.cdg examples/matmul_epilogue.cdg examples/sdpa.cdg \
  --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee -a "$LOG"
section "cudnn-dsl bench --cold-l2 (the matmul epilogue's inputs fit in the L2 when warm)"
cdsl bench examples/matmul_epilogue.cdg --cold-l2 --no-peak --against cudnn,torch,compile \
  --json "$OUT/bench-cold.json" 2>&1 | tee -a "$LOG"
fi
if want eject; then
section "bench/eject_parity.py"
python3 bench/eject_parity.py --json "$OUT/eject.json" 2>&1 | tail -3 | tee -a "$LOG"
fi
if want torch_op; then
section "bench/torch_op.py (host cost per call of the torch op path)"
timeout 300 python3 bench/torch_op.py --json "$OUT/torch_op.json" 2>&1 | tee -a "$LOG" | tail -7
fi
if want partition; then
section "bench/partition_time.py (partitioning time by graph size, each part built on the GPU)"
timeout 600 python3 bench/partition_time.py --json "$OUT/partition_time.json" 2>&1 | tee -a "$LOG" | tail -9
fi
if want patterns; then
section "bench/patterns.py (the example models compiled, without and with their regions replaced)"
timeout 300 python3 bench/patterns.py --json "$OUT/patterns.json" 2>&1 | tee -a "$LOG" | tail -4
fi
if want library_ops; then
section "bench/library_ops.py (the library's regions at GPT-2's and a Llama layer's sizes: each op beside torch's)"
timeout 300 python3 bench/library_ops.py --json "$OUT/library_ops.json" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -8
fi
if want models; then
section "bench/models.py (ResNet-50, GPT-2 124M, a Llama layer: every torch.compile mode, with and without the library)"
timeout 1500 python3 bench/models.py ${MODELS_ARGS:-} --json "$OUT/models.json" 2>&1 | grep -v -i warn | tee -a "$LOG" | tail -40
fi
if want bmm; then
section "bare bmm (the stretch goal's yardstick)"
python3 - <<'PY' 2>&1 | tee -a "$LOG"
import statistics, torch
from cudnn_dsl.run.timing import gpu_time_us
a = torch.rand(16, 512, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.rand(16, 1024, 512, device="cuda", dtype=torch.bfloat16)
print(f"bare bmm 16x512x1024x512 bf16 (torch.bmm): {statistics.median(gpu_time_us(lambda: torch.bmm(a, b), 30, 3, 10)):.1f} µs")
PY
fi
if want sweep; then
section "cudnn-dsl sweep, mode tune (a worker per GPU), against the single-process tune above"
SWEEP_DIR="${TMPDIR:-/tmp}/cudnn-dsl-sweep-$$"
mkdir -p "$SWEEP_DIR"
cat > "$SWEEP_DIR/sweep.toml" <<TOML
[sweep]
name = "gpu-all"
graphs = ["$PWD/examples/conv_bias_relu.cdg", "$PWD/examples/matmul_epilogue.cdg", "$PWD/examples/sdpa.cdg", "$PWD/examples/dynamic_shapes.cdg"]
mode = "tune"
store = "store"
[tune_targets]
"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" = 0
TOML
cdsl sweep "$SWEEP_DIR/sweep.toml" --json "$OUT/sweep-tune.json" >> "$LOG" 2>&1 || echo "sweep exit status $?" | tee -a "$LOG"
python3 - "$SWEEP_DIR/store" "$OUT/tune.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
store, tuned = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
latest = (store / "LATEST").read_text().strip().removeprefix("sha256:")
manifest = json.loads((store / "manifests" / f"{latest}.json").read_text())
winners = {(g["graph"], json.dumps(g["binding"], sort_keys=True)): g["winner"]["name"]
           for f in tuned["files"] for g in f["graphs"] if g.get("winner")}
for row in manifest["plans"].values():
    entry = json.loads((store / "entries" / f"{row['sha256']}.json").read_text())
    alone = winners.get((row["graph"], json.dumps(row["binding"], sort_keys=True)), "(not tuned alone)")
    print(f"{row['graph']} {row['binding']}: sweep {entry['plan_name']} {entry['timing']['median_us']:.1f} us; "
          f"tune alone {alone}")
uuids = {json.loads(p.read_text())["provenance"].get("gpu_uuid") for p in (store / "measurements").rglob("*.json")}
print(f"{len(manifest['plans'])} plans in manifest sha256:{latest}; GPU UUIDs in the records: {sorted(map(str, uuids))}")
PY
fi
