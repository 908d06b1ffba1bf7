#!/usr/bin/env bash
# The CPU roofline on this machine: makes the issue's 125M Llama (hidden 768, 12 layers, GQA 12/4,
# intermediate 2048, vocab 32000, bf16) and runs build/bin/bench_cpu_roofline on it. With --baseline DIR
# (a directory holding an older build's `kvfleet`; may be given more than once), it also times old and new
# `kvfleet generate` on the same workloads, interleaved (old, new, old, new), and prints new/old ratios,
# for each thread count of --threads (a list: 1,2).
#
#   bench/cpu_roofline.sh [--threads 2|1,2] [--tokens 24] [--prefills 3] [--rounds 3] [--baseline DIR]...
#                         [--workloads b1,b8,b32,p512,p8x128] [--no-4k] [--compare-only] [--model DIR] [--raw FILE]
# --model DIR: that model (made elsewhere) instead of a fresh 125M Llama. --raw FILE: every timed pair appended
# as a line "threads workload binary measured_tokens full_seconds reference_seconds" (binary: the --baseline
# DIR, or "new"), for a caller that gathers rounds of several calls (bench/cpu_goals.py).
# The comparison with older builds (old = the goals' baseline and a previous build, in one run; one run per
# thread count, as three binaries take 6-7 minutes a thread count at load 5-8, about half that when quiet):
#   bench/cpu_roofline.sh --threads 2 --rounds 3 --compare-only \
#     --baseline /work/baseline-wt-http --baseline /work/baseline-s4      (and again with --threads 1)
#
# How old and new are timed: a binary that cannot be changed is only seen from outside, as the wall time of a
# whole `kvfleet generate` process, and most of that is start-up (loading the model, packing the weights,
# zeroing the KV cache, the first step's page faults), which moves by a few tenths of a second from run to
# run. So every workload is two runs of the same binary that differ only in the measured work, and the rate
# is that work over the difference of their wall times; the start-up, the cold first step and the warm-up
# steps are in both and cancel:
#   decode batch B (b1, b8, b32): B sequences of 8 prompt tokens, 8 generated tokens (the reference run)
#     against 8 + S (the full run); S decode steps of B tokens each (S = 2 x --tokens at batch 1, --tokens
#     at 8 and 32), as bench_cpu_roofline times decode in process (tokens + 1 against 1).
#   prefill 512 (p512): one 512-token prompt (the reference) against 1 + --prefills of them, run one after
#     another (--max-num-seqs 1): each is one 512-token step that also samples one token, on warm weights,
#     as bench_cpu_roofline's prefill (best of its runs, the first one packing).
#   prefill 8 x 128 (p8x128, not in the default list): 8 prompts of 128 tokens (--max-num-seqs 8: one step of
#     1024 tokens that samples 8) against 8 x (1 + --prefills) of them.
# Each round runs, per workload, every binary's pair back to back (the pair's order alternates between
# rounds); the rate printed is the tokens over the median difference, with the lowest and highest rate of
# the rounds in brackets ("-": noise made a difference <= 0), and new/old is the ratio of the medians.
# Every binary gets the same flags, so old and new are measured alike. The new build's own rates here
# should agree with bench_cpu_roofline's (in process) within the run-to-run noise.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/bin
threads=2 tokens=24 prefills=3 baselines=() rounds=3 no4k="" compare_only="" workloads=b1,b8,b32,p512 model="" raw=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --prefills) prefills=$2; shift 2 ;;
    --baseline) baselines+=("$2"); shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --workloads) workloads=$2; shift 2 ;;
    --no-4k) no4k=--no-4k; shift ;;
    --compare-only) compare_only=1; shift ;;
    --model) model=$2; shift 2 ;;
    --raw) raw=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d /tmp/kvfleet-roofline.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [[ -z $model ]]; then
  model=$work/llama-125m
  "$bin/kvfleet" make-model --arch llama --layers 12 --hidden 768 --intermediate 2048 --heads 12 --kv-heads 4 \
    --vocab 32000 --dtype bfloat16 --max-position 8192 --out "$model" > /dev/null
fi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -z $compare_only ]]; then
  for t in ${threads//,/ }; do "$bin/bench_cpu_roofline" --model "$model" --threads "$t" --tokens "$tokens" $no4k; done
fi
[[ ${#baselines[@]} -eq 0 ]] && exit 0
for d in "${baselines[@]}"; do
  [[ -x $d/kvfleet ]] || { echo "--baseline $d: no kvfleet binary there (give the folder that holds it)" >&2; exit 2; }
done

prompts() {  # N sequences, P prompt tokens, G generated tokens
  for ((i = 0; i < $1; i++)); do
    ids=$(seq -s, $((i * 131 + 1)) $((i * 131 + $2)))
    echo "{\"id\":\"$i\",\"prompt_ids\":[$ids],\"max_tokens\":$3}"
  done
}
declare -A seqs=() measured=() flags=()  # per workload: sequences per step, tokens measured, generate flags
for w in ${workloads//,/ }; do
  case $w in
    b1 | b8 | b32)
      n=${w#b} s=$((n == 1 ? 2 * tokens : tokens))
      prompts "$n" 8 8 > "$work/$w.ref.jsonl"
      prompts "$n" 8 $((8 + s)) > "$work/$w.full.jsonl"
      seqs[$w]=$n measured[$w]=$((n * s)) blocks=$((n * ((16 + s) / 16 + 1) + 16)) ;;
    p512)
      prompts 1 512 1 > "$work/$w.ref.jsonl"
      prompts $((1 + prefills)) 512 1 > "$work/$w.full.jsonl"
      seqs[$w]=1 measured[$w]=$((512 * prefills)) blocks=$(((1 + prefills) * 34 + 16)) ;;
    p8x128)
      prompts 8 128 1 > "$work/$w.ref.jsonl"
      prompts $((8 * (1 + prefills))) 128 1 > "$work/$w.full.jsonl"
      seqs[$w]=8 measured[$w]=$((8 * 128 * prefills)) blocks=$((8 * (1 + prefills) * 10 + 16)) ;;
    *) echo "unknown workload $w (b1, b8, b32, p512, p8x128)" >&2; exit 2 ;;
  esac
  # The KV cache sized to the workload (each engine zeroes all of it at start-up), 2048 tokens a step.
  flags[$w]="--max-num-seqs ${seqs[$w]} --max-batched-tokens 2048 --num-blocks $blocks"
done
timed() {  # KVFLEET_BIN FILE THREADS FLAGS -> wall seconds of one `kvfleet generate`
  local t0=$EPOCHREALTIME
  # shellcheck disable=SC2086  # FLAGS is a list of words
  "$1" generate --model "$model" --prompts "$2" --ignore-eos --no-prefix-cache --threads "$3" $4 > /dev/null
  awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.6f", b - a }'
}
stats() {  # values... -> "median lowest highest"
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.6f %.6f %.6f", m, v[1], v[NR] }'
}
rate() {  # TOKENS SECONDS -> tokens/s ("-" where noise made the difference of the two runs <= 0)
  awk -v n="$1" -v d="$2" 'BEGIN { if (d > 0) printf "%.1f", n / d; else printf "-" }'
}
rates() {  # TOKENS DIFFERENCES... -> "median [lowest-highest]" tok/s
  local n=$1 med lo hi
  shift
  read -r med lo hi <<< "$(stats "$@")"
  printf '%7s [%s-%s]' "$(rate "$n" "$med")" "$(rate "$n" "$hi")" "$(rate "$n" "$lo")"
}
echo "old vs new, interleaved, $rounds rounds; tok/s = measured tokens / median over rounds of (wall time of the full run"
echo "- wall time of the reference run), [lowest-highest] of the rounds; load $(cut -d' ' -f1 /proc/loadavg)"
nb=${#baselines[@]}
for ((b = 0; b < nb; b++)); do echo "old$b = ${baselines[$b]}/kvfleet"; done
for w in ${workloads//,/ }; do echo "$w: ${measured[$w]} tokens measured; ${flags[$w]}"; done
for t in ${threads//,/ }; do
  declare -A diffs=() refs=()
  for ((r = 0; r < rounds; r++)); do
    for w in ${workloads//,/ }; do
      for ((b = 0; b <= nb; b++)); do  # b == nb: the new build
        if ((b < nb)); then k=${baselines[$b]}/kvfleet; else k=$bin/kvfleet; fi
        if ((r % 2 == 0)); then
          ref=$(timed "$k" "$work/$w.ref.jsonl" "$t" "${flags[$w]}")
          full=$(timed "$k" "$work/$w.full.jsonl" "$t" "${flags[$w]}")
        else
          full=$(timed "$k" "$work/$w.full.jsonl" "$t" "${flags[$w]}")
          ref=$(timed "$k" "$work/$w.ref.jsonl" "$t" "${flags[$w]}")
        fi
        diffs[$w,$b]+=" $(awk -v f="$full" -v s="$ref" 'BEGIN { printf "%.6f", f - s }')"
        if [[ -n $raw ]]; then
          if ((b < nb)); then name=${baselines[$b]}; else name=new; fi
          echo "$t $w $name ${measured[$w]} $full $ref" >> "$raw"
        fi
        refs[$w,$b]+=" $ref"
      done
    done
  done
  for w in ${workloads//,/ }; do
    n=${measured[$w]}
    # shellcheck disable=SC2086  # lists of numbers
    read -r new_diff _ _ <<< "$(stats ${diffs[$w,$nb]})"
    # shellcheck disable=SC2086
    read -r ref_med _ _ <<< "$(stats ${refs[$w,$nb]})"
    # shellcheck disable=SC2086
    line=$(printf 'threads %s %-5s new %s tok/s (reference run %.2f s)' "$t" "$w" "$(rates "$n" ${diffs[$w,$nb]})" "$ref_med")
    for ((b = 0; b < nb; b++)); do
      # shellcheck disable=SC2086
      read -r old_diff _ _ <<< "$(stats ${diffs[$w,$b]})"
      ratio=$(awk -v a="$new_diff" -v b="$old_diff" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", b / a; else printf "-" }')
      # shellcheck disable=SC2086
      line+=" | old$b $(rates "$n" ${diffs[$w,$b]}), new/old$b $ratio"
    done
    echo "$line"
  done
  unset diffs refs
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
