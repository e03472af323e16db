#!/usr/bin/env bash
# One-command GPU check: throughput of the pipeline modes on real GPUs (or 4 logical GPUs
# split from one) against single-device model.fit and data parallelism, and the cost
# model's validation, in about 8 minutes; every table goes into one file.
#
#   bash benchmarks/gpu.sh                 # writes gpu-results-<host>-<date>.md
#   bash benchmarks/gpu.sh results.md      # or there
#
# Needs an NVIDIA GPU with its driver (nvidia-smi) and the GPU build of TensorFlow:
#   pip install -e ".[gpu]"
# With fewer than 4 GPUs, tf_spectrain.setup_devices splits them into 4 logical GPUs
# (stages then share a GPU: the table shows the machinery's cost, not a speed-up).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-gpu-results-$(hostname)-$(date +%Y%m%d-%H%M).md}"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu.sh: nvidia-smi not found: this script is for a machine with NVIDIA GPUs." >&2
    echo "On a CPU-only machine use: python -m benchmarks.throughput --quick" >&2
    exit 2
fi
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
if [ "$GPUS" -lt 1 ]; then
    echo "gpu.sh: nvidia-smi lists no GPU." >&2
    exit 2
fi
python - <<'EOF'
import sys
import tensorflow as tf
if not tf.config.list_physical_devices("GPU"):
    sys.exit("gpu.sh: TensorFlow sees no GPU; install the GPU build: pip install -e '.[gpu]'")
EOF

{
    echo "# tf_spectrain GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "GPUs (nvidia-smi):"
    echo
    echo '```'
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
    echo '```'
    echo
    echo "tensorflow $(python -c 'import tensorflow as tf; print(tf.__version__)'), $GPUS GPU(s)"
    echo
    echo "## Throughput (VGG16, batch 128, 4 stages)"
    echo
} > "$OUT"

# One round of 7 configurations, each a fresh process (start-up and tracing dominate on a
# GPU: an estimated 20-30 s each), so that with the cost-model check (3-4 minutes) the whole
# script stays under 8 minutes. For a median of several rounds run throughput.py with
# --repeats 2 or more.
python -m benchmarks.throughput --stages 4 --batch-size 128 --steps 24 --skip 4 --repeats 1 \
    --configs single,dp,sync,stash,spectrain-consistent,spectrain-paper,vanilla \
    --out "$OUT.throughput"
cat "$OUT.throughput" >> "$OUT" && rm -f "$OUT.throughput"

{
    echo
    echo "## Cost model validation and predicted speed-ups"
    echo
} >> "$OUT"
python -m benchmarks.speedup --quick --out "$OUT.costmodel"
cat "$OUT.costmodel" >> "$OUT" && rm -f "$OUT.costmodel"

echo "gpu.sh: tables written to $OUT"
