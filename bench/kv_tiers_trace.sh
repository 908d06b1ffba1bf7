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
# llama, 4 layers x 384 hidden, 2048 positions, the default model's tokenizer); SEED (default 1); REPEATS
# (default 2: every setup runs twice, interleaved, and the comparison takes medians).
# Extra arguments go to both kvfleet-bench runs (e.g. --max-concurrency 4, --tiers off,host).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
bin=$build/bin
out=${OUT:-$build/kv-tiers-trace}
model=${MODEL:-$build/models/kvfleet-llama-384}
seed=${SEED:-1}
repeats=${REPEATS:-2}
for b in kvfleet kvfleet-replica kvfleet-router kvfleet-bench; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cmake --build $build --target $b" >&2; exit 1; }
done
if [ ! -f "$model/config.json" ]; then
  "$bin/kvfleet" make-model --arch llama --layers 4 --hidden 384 --intermediate 1024 --heads 6 --kv-heads 2 \
    --max-position 2048 --dtype float32 --tie --seed 1 --tokenizer "$root/models/kvfleet-default" --out "$model"
fi
mkdir -p "$out"
# Conversations come back every ~20 s of trace time (2 s replayed at --trace-time-scale 0.1), after the
# device pool has turned over; agents call a tool every ~2 s.
python3 "$root/scripts/make_trace.py" --kind mix --seed "$seed" --sessions 24 --rate 2 --system-prompts 3 \
  --system-blocks 2 --turns 6 --think-time 20 --tool-calls 6 --tool-time 2 --out "$out/reuse.jsonl"
python3 "$root/scripts/make_trace.py" --kind no-reuse --seed "$seed" --requests 40 --rate 1.5 --input-tokens 3072 \
  --output-tokens 64 --out "$out/no-reuse.jsonl"
# 64 tokens per 512-token trace block: prompts of up to ~600 tokens, working sets of ~11k and ~15k tokens.
# The host tier (0.1 GiB) and the disk tier (0.5 GiB) each hold the working set (~4 KiB of KV per token).
common=(--model "$model" --dataset-name trace --trace-block-tokens 64 --trace-max-output 16 --max-concurrency 8
  --host-gib 0.1 --disk-gib 0.5 --seed "$seed" --replica-flag=--cpu-threads=1 --router-flag=--http-threads=1
  --request-timeout 120)
nice -n 10 timeout 1200 "$bin/kvfleet-bench" compare-tiers "${common[@]}" --trace-file "$out/reuse.jsonl" \
  --trace-time-scale 0.1 --repeats "$repeats" --out-dir "$out/reuse" "$@"
# The no-reuse trace is sent all at once (--trace-time-scale 0, 8 in flight), so its throughput is the
# replica's capacity and the tiers' cost shows in it.
nice -n 10 timeout 600 "$bin/kvfleet-bench" compare-tiers "${common[@]}" --trace-file "$out/no-reuse.jsonl" \
  --trace-time-scale 0 --repeats $((repeats + 1)) --topologies replica --out-dir "$out/no-reuse" "$@"
