#!/usr/bin/env bash
# Fig. 8 analogue: latency CCDF of mark and SageMaker on Twitter (from the Table 5 run) and on
# MMPP load (4 h, as in the paper), Inception-v3. Run from the repository root. The MMPP
# run keeps the 15-minute warm-up it was made with (mark simulate's default before 2026-11-29).
set -euo pipefail
cd "$(dirname "$0")/../.."
MARK=".venv/bin/mark"
$MARK simulate --trace mmpp --hours 4 --model inception-v3 --policies mark,sagemaker,clairvoyant \
  --predictor lstm --warmup-s 900 --format csv --out experiments/fig8/mmpp | tee experiments/fig8/mmpp.csv
