#!/bin/bash
# End-to-end live hints on a CPU: a TRL round (embedded SmolLM2-135M policy, 2 GSM8K prompts x 4, 2 steps) whose
# collapsed groups are hinted by a `mentor serve` hint engine (the embedded model on vLLM CPU, port 18123).
# Usage: tests/benchmarks/live_hints_e2e.sh [OUT_DIR]   (about 15 minutes on a busy 2-core machine)
set -u
W=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-/tmp/mentor-live-e2e}; mkdir -p "$OUT"; cd "$OUT"
PY=$W/.venv/bin/python
MENTOR=$W/.venv/bin/mentor
rm -rf run round.yaml serve.log
$MENTOR build --base gsm8k --round 1 --out run/round-001/prompts > build.log 2>&1 || { echo build failed; cat build.log; exit 1; }
MODEL=$($PY -c "from mentor.pipeline.models import ensure_embedded_model; print(ensure_embedded_model())")
nice -n 5 $MENTOR serve --port 18123 --max-model-len 4096 > serve.log 2>&1 &
SERVE=$!
echo "serve pid $SERVE"
for i in $(seq 1 120); do
  curl -sf http://127.0.0.1:18123/v1/models > /dev/null && break
  kill -0 $SERVE 2>/dev/null || { echo "serve died"; tail -30 serve.log; exit 1; }
  sleep 5
done
curl -s http://127.0.0.1:18123/v1/models; echo
cat > round.yaml <<YAML
kind: trl
round: 1
round_dir: $OUT/run/round-001
actor_model: $MODEL
limit: 2
max_steps: 2
per_device_train_batch_size: 8
max_completion_length: 48
save_strategy: "no"
logging_steps: 1
seed: 0
live_hints:
  backend: {backend: openai, base_url: "http://127.0.0.1:18123/v1", model: smollm2-135m}
  max_problems_per_step: 2
  placement: after
  hint:
    max_refine: 0
    max_retry: 0
    llm_judge: false
    max_tokens: {attribution: 192, generation: 192, judgment: 128, repair: 192}
YAML
time $MENTOR train --config round.yaml
echo "train exit $?"
grep -E "live hints step|'step_time'" run/round-001/train/train.log | cut -c1-600
$MENTOR ingest run/round-001/rollouts/log --out ro --problems gsm8k | tail -3
$MENTOR mine ro --out mined | tail -3
$PY - <<'PY'
import json, glob, collections
recs=[json.loads(l) for f in glob.glob("run/round-001/rollouts/log/*.jsonl") for l in open(f)]
print(len(recs), collections.Counter((r["step"], r["live_status"]) for r in recs))
for r in recs:
    if r["live_status"]=="rerolled":
        print("hint:", r["live_hint_status"], repr(r["live_hint"][:200])); break
PY
kill $SERVE; wait $SERVE 2>/dev/null
