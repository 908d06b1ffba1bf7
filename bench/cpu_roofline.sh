#!/usr/bin/env bash
# The CPU roofline of issue 20 on this machine: makes the issue's 125M Llama (hidden 768, 12 layers, GQA 12/4,
# intermediate 2048, vocab 32000, bf16) and runs build/bin/bench_cpu_roofline on it. With --baseline DIR
# (a directory holding an older build's `kvfleet`; may be given more than once), it also times old and new
# `kvfleet generate` on the same workloads, interleaved (old, new, old, new), and prints new/old ratios,
# for each thread count of --threads (a list: 1,2).
#
#   bench/cpu_roofline.sh [--threads 2|1,2] [--tokens 64] [--baseline DIR]... [--rounds 2] [--no-4k]
#                         [--compare-only]
# The final comparison of issue 20 (old = the issue's "today" and the previous stop, in one run):
#   bench/cpu_roofline.sh --threads 1,2 --tokens 24 --rounds 3 --compare-only \
#     --baseline /work/baseline-wt-http --baseline /work/baseline-gemm
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/bin
threads=2 tokens=64 baselines=() rounds=2 no4k="" compare_only=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --baseline) baselines+=("$2"); shift 2 ;;
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
if [[ -z $compare_only ]]; then
  for t in ${threads//,/ }; do "$bin/bench_cpu_roofline" --model "$model" --threads "$t" --tokens "$tokens" $no4k; done
fi
[[ ${#baselines[@]} -eq 0 ]] && exit 0

# Old vs new: wall time of `kvfleet generate`, less the wall time of a run that only starts, loads the model
# (and packs it: the new CPU backend's one-off cost, in the s0 times printed) and computes one token of an
# 8-token prompt (s0). So decode is (tokens - 1) steps / (t - t_s0), prefill 512 is ~504 tokens / (t - t_s0).
prompts() {  # N sequences, P prompt tokens, G generated tokens
  for ((i = 0; i < $1; i++)); do
    ids=$(seq -s, $((i * 131 + 1)) $((i * 131 + $2)))
    echo "{\"id\":\"$i\",\"prompt_ids\":[$ids],\"max_tokens\":$3}"
  done
}
prompts 1 8 1 > "$work/s0.jsonl"
prompts 1 8 $((tokens * 2)) > "$work/b1.jsonl"
prompts 8 8 "$tokens" > "$work/b8.jsonl"
prompts 32 8 "$tokens" > "$work/b32.jsonl"
prompts 1 512 1 > "$work/p512.jsonl"
timed() {  # KVFLEET_BIN FILE THREADS -> seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$1" generate --model "$model" --prompts "$2" --ignore-eos --no-prefix-cache --threads "$3" \
    --max-num-seqs 64 --num-blocks 2048 > /dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
min() { echo "if ($1 < $2) $1 else $2" | bc -l; }
echo "old vs new, interleaved, best of $rounds rounds (tokens/s from wall time less start-up; load $(cut -d' ' -f1 /proc/loadavg))"
nb=${#baselines[@]}
for ((b = 0; b < nb; b++)); do echo "old$b = ${baselines[$b]}/kvfleet"; done
for t in ${threads//,/ }; do
  declare -A best=()
  for ((r = 0; r < rounds; r++)); do
    for w in s0 b1 b8 b32 p512; do
      for ((b = 0; b <= nb; b++)); do  # b == nb: the new build
        if ((b < nb)); then k=${baselines[$b]}/kvfleet; else k=$bin/kvfleet; fi
        v=$(timed "$k" "$work/$w.jsonl" "$t")
        best[$w,$b]=$(min "$v" "${best[$w,$b]:-1000000000}")
      done
    done
  done
  line="threads $t s0 (start-up) new ${best[s0,$nb]} s"
  for ((b = 0; b < nb; b++)); do line+=" | old$b ${best[s0,$b]} s"; done
  echo "$line"
  for w in b1 b8 b32 p512; do
    case $w in b1) n=$((tokens * 2 - 1)) ;; b8) n=$((8 * (tokens - 1))) ;; b32) n=$((32 * (tokens - 1))) ;; p512) n=504 ;; esac
    rate() { echo "$n / (${best[$w,$1]} - ${best[s0,$1]})" | bc -l; }
    new_rate=$(rate "$nb")
    line=$(printf 'threads %s %-5s new %7.1f tok/s' "$t" "$w" "$new_rate")
    for ((b = 0; b < nb; b++)); do
      old_rate=$(rate "$b")
      line+=$(printf ' | old%d %7.1f tok/s, new/old%d %.2fx' "$b" "$old_rate" "$b" "$(echo "$new_rate / $old_rate" | bc -l)")
    done
    echo "$line"
  done
  unset best
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
