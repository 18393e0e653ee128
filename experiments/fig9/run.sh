#!/usr/bin/env bash
# Fig. 9 analogue. (a)-(c): LSTM-ptb at a steady 100 r/s rises by 50/75/100 % within 2 minutes
# at minute 30 and holds 10 minutes; nothing forecasts it (the history is flat).
# (d): the spot fleet mark-spot buys for LSTM-ptb at 600 r/s (13 c5.xlarge) gets interruption
# notices for 20/40/80 % of it at minute 7. Run from the repository root. The warm-up is the
# 15 minutes these were made with: a flat base load forms no state a longer one would add.
set -euo pipefail
cd "$(dirname "$0")/../.."
MARK=".venv/bin/mark"
for s in 0.5 0.75 1.0; do
  $MARK simulate --trace surge --surge "$s" --base-rps 100 --hours 1 --model lstm-ptb \
    --policies mark,sagemaker --predictor last --warmup-s 900 --format csv \
    --out "experiments/fig9/surge-$s" | tee "experiments/fig9/surge-$s.csv"
done
for f in 0.2 0.4 0.8; do
  $MARK simulate --trace surge --surge 0 --base-rps 600 --hours 0.5 --model lstm-ptb \
    --policies mark-spot --predictor last --interrupt "420:$f" --warmup-s 900 --format csv \
    --out "experiments/fig9/interrupt-$f" | tee "experiments/fig9/interrupt-$f.csv"
done
