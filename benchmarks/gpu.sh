#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md in one prepared run, for a machine with CUDA and
# no network (the device machine): bf16 training step (eager and compiled) and decoding,
# each against the hand-written reference and transformers, with tokens/s and MFU.
#
#   bash benchmarks/gpu.sh                 # train,compiled,decode
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
"$PY" benchmarks/run.py --device cuda --dtype bfloat16 --batch 16 --seq 256 --rounds 7 \
  --only "${SECTIONS:-train,compiled,decode}" --write 2>&1 | tee "$log"
if [ -n "${OUT:-}" ]; then
  cp benchmarks/results_gpu.json docs/benchmarks.md "$OUT"/
fi
