#!/usr/bin/env bash
# Everything this project runs on the GPU machine, in one go; results under $OUT (default ./out).
# Usage (from the repo root): bash bench/gpu_all.sh
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDNN_DSL_CACHE_DIR="$OUT/cache-$$"
cdsl() { python3 -m cudnn_dsl "$@"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
timeout 300 python3 -m pytest -m gpu -q -rfE tests -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -3
for f in examples/*.cdg; do cdsl run "$f" --json "$OUT/run_$(basename "$f" .cdg).json"; done > "$OUT/run_all.txt" 2>&1
grep -E "^graph|plan  |gpu time|compare|note" "$OUT/run_all.txt" | cut -c1-160
cdsl run examples/cuda_graph_conv.cdg | grep -E "plan  |gpu time|compare"
timeout 200 python3 bench/reuse.py --json "$OUT/reuse.json" 2>&1 | tee "$OUT/reuse.txt" | tail -24
cdsl tune examples/conv_bias_relu.cdg examples/matmul_epilogue.cdg examples/sdpa.cdg examples/plan_serialization.cdg --plot "$OUT/tune.png" --json "$OUT/tune.json" > "$OUT/tune.txt" 2>&1 || echo "tune failed: $(tail -3 $OUT/tune.txt)"
grep -E "winner|first choice" "$OUT/tune.txt"
cdsl bench examples/conv_bias_relu.cdg examples/matmul_epilogue.cdg examples/sdpa.cdg --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench.txt"
python3 bench/eject_parity.py --json "$OUT/eject.json" 2>&1 | tail -4
python3 - <<'PY' 2>&1 | tee "$OUT/bare_bmm.txt"
import statistics, torch
from cudnn_dsl.runtime import gpu_time_us
a = torch.rand(16, 512, 1024, device="cuda", dtype=torch.bfloat16)
b = torch.rand(16, 1024, 512, device="cuda", dtype=torch.bfloat16)
print(f"bare bmm 16x512x1024x512 bf16 (torch.bmm): {statistics.median(gpu_time_us(lambda: torch.bmm(a, b), 30, 3, 10)):.1f} µs")
PY
