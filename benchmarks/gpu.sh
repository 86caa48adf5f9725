#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one prepared run, for a machine with CUDA and
# no network (the device machine): bf16 training step (eager and compiled) and decoding,
# each against the hand-written reference and transformers, with tokens/s and MFU.
#
#   bash benchmarks/gpu.sh                 # train,compiled,decode,parallel (parallel: 2 GPUs or more)
#   SECTIONS=train,decode bash benchmarks/gpu.sh
#
# Python packages the machine lacks (lark, pydantic and its parts) travel as wheels in
# .whl/ (see docs/benchmarks.md, "On a GPU"); with $OUT set, the results and the log
# are copied there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
"$PY" - <<'PY'
import importlib, sys
import torch
if not torch.cuda.is_available():
    sys.exit("no CUDA device: this script measures a GPU")
missing = [m for m in ("lark", "pydantic", "transformers") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (carry them as wheels in .whl/)")
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
PY
log=${OUT:-/tmp}/gpu_bench.log
sections=${SECTIONS:-train,compiled,decode,parallel}
single=$(echo "$sections" | tr ',' '\n' | grep -v '^parallel$' | paste -sd, || true)
if [ -n "$single" ]; then
  "$PY" benchmarks/run.py --device cuda --dtype bfloat16 --batch 16 --seq 256 --rounds 7 \
    --only "$single" --write 2>&1 | tee "$log"
  if [ -n "${OUT:-}" ]; then
    cp benchmarks/results_gpu.json docs/benchmarks.md "$OUT"/
  fi
fi
# The multi-parallel line (several GPUs): specs/llama.cycle trained 30 steps in bf16 on the
# docs as data, FSDP over every GPU (the reference) against pipeline x FSDP and pipeline x
# tensor parallel on the same GPUs and global batch: tokens/s (median of steps 6-30) and the
# ratio to the reference.
if [[ ",$sections," == *",parallel,"* ]]; then
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if (( gpus < 2 )); then
    echo "parallel: $gpus GPU here; the multi-parallel line needs 2 or more" | tee -a "$log"
  else
    runs=${OUT:-/tmp}/parallel_runs
    rm -rf "$runs" && mkdir -p "$runs"
    common=(--data docs --steps 30 --seq 256 --microbatches 4 --dtype bf16 --eval-every 0
            --eval-batches 1 --ckpt-every 0 --no-progress)
    train() {  # NAME FLAGS...
      local name=$1; shift
      "$PY" -m torch.distributed.run --standalone --nproc-per-node "$gpus" -m cyclelang train specs/llama.cycle \
        --out "$runs/$name" "${common[@]}" "$@" 2>&1 | tail -2 | tee -a "$log"
    }
    # the same 16 x gpus rows a step: 4 micro-steps of 4 rows per GPU, of 8 per data-parallel
    # rank at pp 2, of 16 at pp 2 x tp 2
    train fsdp --fsdp --micro-batch 4
    train pp2_fsdp --pp 2 --fsdp --micro-batch 8 --pp-schedule 1f1b
    if (( gpus >= 4 && gpus % 4 == 0 )); then
      train pp2_tp2 --pp 2 --tp 2 --fsdp --micro-batch 16 --pp-schedule interleaved
    fi
    "$PY" - "$runs" <<'PY' | tee -a "$log"
import json, statistics, sys
from pathlib import Path
runs = Path(sys.argv[1])
def rate(name):
    recs = [json.loads(x) for x in (runs / name / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r["step"] > 5)
ref = rate("fsdp")
for name in ("fsdp", "pp2_fsdp", "pp2_tp2"):
    if (runs / name / "metrics.jsonl").exists():
        print(f"parallel {name:<10} {rate(name):>12,.0f} tokens/s  {rate(name) / ref:5.2f}x FSDP")
PY
  fi
fi
