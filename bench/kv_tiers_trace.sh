#!/usr/bin/env bash
# The KV tiers on production-shaped traces, on this machine: writes two Mooncake-format traces with
# scripts/make_trace.py (a mix of growing chat conversations and tool-agent loops over shared system
# prompts; and one with no reuse at all), then runs `kvfleet-bench compare-tiers` on each: fresh replicas
# with the tiers off, the host tier, the disk tier, one replica directly and 2 behind the router, the
# device pool holding ~10% of the trace's working set. Report: $OUT/reuse/report.md and
# $OUT/no-reuse/report.md (tables: hit ratio per tier, infinite-cache hit ratio, TTFT p50/p90, throughput).
# Bounded: a few minutes on a loaded 2-core VM.
#
# Environment: BUILD (default build), OUT (default $BUILD/kv-tiers-trace), MODEL (default: a generated
# llama, 4 layers x 256 hidden, 2048 positions, the default model's tokenizer); SEED (default 1).
# Extra arguments go to both kvfleet-bench runs (e.g. --max-concurrency 4, --tiers off,host).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
bin=$build/bin
out=${OUT:-$build/kv-tiers-trace}
model=${MODEL:-$build/models/kvfleet-llama-2k}
seed=${SEED:-1}
for b in kvfleet kvfleet-replica kvfleet-router kvfleet-bench; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cmake --build $build --target $b" >&2; exit 1; }
done
if [ ! -f "$model/config.json" ]; then
  "$bin/kvfleet" make-model --arch llama --layers 4 --hidden 256 --intermediate 768 --heads 4 --kv-heads 2 \
    --max-position 2048 --dtype float32 --tie --seed 1 --tokenizer "$root/models/kvfleet-default" --out "$model"
fi
mkdir -p "$out"
python3 "$root/scripts/make_trace.py" --kind mix --seed "$seed" --sessions 24 --rate 2 --system-prompts 3 \
  --system-blocks 4 --turns 5 --think-time 4 --tool-calls 6 --tool-time 1 --out "$out/reuse.jsonl"
python3 "$root/scripts/make_trace.py" --kind no-reuse --seed "$seed" --requests 60 --rate 4 --input-tokens 3072 \
  --output-tokens 64 --out "$out/no-reuse.jsonl"
# 64 tokens per 512-token trace block: prompts of up to ~1.2k tokens, a working set of ~20k tokens.
common=(--model "$model" --dataset-name trace --trace-block-tokens 64 --trace-max-output 16 --trace-time-scale 0.5
  --max-concurrency 8 --seed "$seed" --replica-flag=--cpu-threads=1 --router-flag=--http-threads=1
  --request-timeout 120)
nice -n 10 timeout 900 "$bin/kvfleet-bench" compare-tiers "${common[@]}" --trace-file "$out/reuse.jsonl" \
  --out-dir "$out/reuse" "$@"
nice -n 10 timeout 600 "$bin/kvfleet-bench" compare-tiers "${common[@]}" --trace-file "$out/no-reuse.jsonl" \
  --topologies replica --out-dir "$out/no-reuse" "$@"
