#!/usr/bin/env bash
# The CPU roofline of issue 20 on this machine: makes the issue's 125M Llama (hidden 768, 12 layers, GQA 12/4,
# intermediate 2048, vocab 32000, bf16) and runs build/bin/bench_cpu_roofline on it. With --baseline DIR
# (a directory holding an older build's `kvfleet`), it also times old and new `kvfleet generate` on the
# same workloads, interleaved (old, new, old, new), and prints new/old ratios.
#
#   bench/cpu_roofline.sh [--threads 2] [--tokens 64] [--baseline /work/baseline-x] [--rounds 2] [--no-4k]
#                         [--compare-only]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/bin
threads=2 tokens=64 baseline="" rounds=2 no4k="" compare_only=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-4k) no4k=--no-4k; shift ;;
    --compare-only) compare_only=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/kvfleet-roofline.XXXXXX)
trap 'rm -rf "$work"' EXIT
model=$work/llama-125m
"$bin/kvfleet" make-model --arch llama --layers 12 --hidden 768 --intermediate 2048 --heads 12 --kv-heads 4 \
  --vocab 32000 --dtype bfloat16 --max-position 8192 --out "$model" > /dev/null
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ -z $compare_only ]] && "$bin/bench_cpu_roofline" --model "$model" --threads "$threads" --tokens "$tokens" $no4k
[[ -z $baseline ]] && exit 0

# Old vs new: wall time of one `kvfleet generate` (process start and model load included, the same for both).
prompts() {  # N sequences, P prompt tokens, G generated tokens
  for ((i = 0; i < $1; i++)); do
    ids=$(seq -s, $((i * 131 + 1)) $((i * 131 + $2)))
    echo "{\"id\":\"$i\",\"prompt_ids\":[$ids],\"max_tokens\":$3}"
  done
}
prompts 1 8 $((tokens * 2)) > "$work/b1.jsonl"
prompts 8 8 "$tokens" > "$work/b8.jsonl"
prompts 32 8 "$tokens" > "$work/b32.jsonl"
prompts 1 512 1 > "$work/p512.jsonl"
timed() {  # KVFLEET_BIN FILE -> seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$1" generate --model "$model" --prompts "$2" --ignore-eos --no-prefix-cache --threads "$threads" \
    --max-num-seqs 64 --num-blocks 2048 > /dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
echo "old vs new, interleaved, $rounds rounds (tokens/s from wall time incl. start-up; load $(cut -d' ' -f1 /proc/loadavg))"
for w in b1 b8 b32 p512; do
  case $w in b1) n=$((tokens * 2)) ;; b8) n=$((8 * tokens)) ;; b32) n=$((32 * tokens)) ;; p512) n=512 ;; esac
  best_old=1000000000 best_new=1000000000
  for ((r = 0; r < rounds; r++)); do
    o=$(timed "$baseline/kvfleet" "$work/$w.jsonl"); nw=$(timed "$bin/kvfleet" "$work/$w.jsonl")
    best_old=$(echo "if ($o < $best_old) $o else $best_old" | bc -l)
    best_new=$(echo "if ($nw < $best_new) $nw else $best_new" | bc -l)
  done
  printf '%-5s old %8.1f tok/s  new %8.1f tok/s  new/old %.2fx\n' "$w" "$(echo "$n / $best_old" | bc -l)" \
    "$(echo "$n / $best_new" | bc -l)" "$(echo "$best_old / $best_new" | bc -l)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
