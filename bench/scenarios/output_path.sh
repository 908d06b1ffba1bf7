#!/usr/bin/env bash
# The replica's output path end to end: an older kvfleet-replica (--baseline DIR) and this build's,
# interleaved (old, new, old, new: --rounds), each serving --concurrency streaming completions at once
# (kvfleet-bench serve, all sent at t=0, ignore_eos) on a small model with the default model's tokenizer.
# Prints per run: output tokens/s, the replica process's CPU time per generated token (all its threads, read
# from /proc before and after the measured run: the forward pass is the same work in both builds, so the
# difference is the output path: engine callbacks, wake-ups, the handlers' coroutines), and where the replica
# exports them (kvfleet_engine_*_seconds_total, this build) the engine's time per step outside the forward pass.
#
#   bench/scenarios/output_path.sh --baseline DIR [--concurrency 256] [--tokens 32] [--rounds 2] [--threads 2]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$here/build/bin
baseline="" concurrency=256 tokens=32 rounds=2 threads=2
while [[ $# -gt 0 ]]; do
  case $1 in
    --baseline) baseline=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n $baseline ]] || { echo "--baseline DIR (holding an older kvfleet-replica) is required" >&2; exit 2; }
work=$(mktemp -d /tmp/kvfleet-output-path.XXXXXX)
pid=""
cleanup() { [[ -n $pid ]] && kill "$pid" 2> /dev/null; rm -rf "$work"; }
trap cleanup EXIT
model=$work/model
"$bin/kvfleet" make-model --arch llama --layers 2 --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
  --dtype bfloat16 --tokenizer "$here/models/kvfleet-default" --out "$model" > /dev/null
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $concurrency streams x $tokens tokens, --threads $threads"
port=18731
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Each thread's CPU ticks, in creation (thread id) order: "tid:ticks ...". The stat line's comm is one word here.
thread_ticks() { for t in $(ls "/proc/$1/task" | sort -n); do echo -n "$t:$(awk '{print $14 + $15}' "/proc/$1/task/$t/stat") "; done; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
run() {  # REPLICA_BIN LABEL
  "$1" --model "$model" --port "$port" --cpu-threads "$threads" --max-num-seqs "$concurrency" --num-kv-blocks 4096 \
      --max-num-batched-tokens 8192 --max-waiting-requests 1024 > "$work/replica.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.05; done
  local serve=("$bin/kvfleet-bench" serve --base-url "http://127.0.0.1:$port" --model "$model"
    --dataset-name random --random-input-len 16 --random-output-len "$tokens" --random-range-ratio 0
    --request-rate inf --max-concurrency "$concurrency" --seed 1)
  "${serve[@]}" --num-prompts 32 > /dev/null 2>&1  # warm-up
  local c0 s0 f0 n0 t0 t1 c1
  local th0 th1
  th0=$(thread_ticks "$pid")
  c0=$(cpu_ticks "$pid"); s0=$(metric kvfleet_engine_step_seconds_total); f0=$(metric kvfleet_engine_forward_seconds_total)
  n0=$(metric kvfleet_engine_steps_total)
  t0=$(date +%s.%N)
  "${serve[@]}" --num-prompts "$concurrency" --result-file "$work/result.json" > /dev/null 2>&1
  t1=$(date +%s.%N)
  c1=$(cpu_ticks "$pid")
  th1=$(thread_ticks "$pid")
  local s1 f1 n1
  s1=$(metric kvfleet_engine_step_seconds_total); f1=$(metric kvfleet_engine_forward_seconds_total)
  n1=$(metric kvfleet_engine_steps_total)
  kill "$pid"; wait "$pid" 2> /dev/null || true; pid=""
  python3 - "$work/result.json" "$2" "$c0" "$c1" "$t0" "$t1" "$(getconf CLK_TCK)" "${s0:-}" "${s1:-}" "${f0:-}" "${f1:-}" "${n0:-}" "${n1:-}" "$th0" "$th1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
label, c0, c1, t0, t1, hz = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
out = r.get("total_output_tokens") or r.get("output_tokens")
cpu = (c1 - c0) / hz
line = f"{label}: {out} tokens, {out / (t1 - t0):7.1f} tok/s wall, replica CPU {1e6 * cpu / out:7.1f} us/token"
s0, s1, f0, f1, n0, n1 = sys.argv[8:14]
if s1 and n1 and float(n1) > float(n0 or 0):
    steps = float(n1) - float(n0 or 0)
    own = (float(s1) - float(s0 or 0)) - (float(f1) - float(f0 or 0))
    line += f"; engine outside the forward pass {1e3 * own / steps:.3f} ms/step ({100 * own / (float(s1) - float(s0 or 0)):.2f}% of the step)"
before = dict(x.split(":") for x in sys.argv[14].split())
after = [x.split(":") for x in sys.argv[15].split()]
deltas = [(int(c) - int(before.get(t, 0))) * 1e3 / hz for t, c in after]
line += "\n  per thread, creation order (ms CPU): " + " ".join(f"{d:.0f}" for d in deltas)
print(line, flush=True)
EOF
}
for ((r = 0; r < rounds; r++)); do
  run "$baseline/kvfleet-replica" old
  run "$bin/kvfleet-replica" new
done
