#!/usr/bin/env bash
# Per-row sampler CPU time, an older commit's sampler (default: b5a9b74) against this tree's, alternated
# (old, new, old, new) in every mode at vocab 8,192 and 32,000, logit std 0.5 and 2. Both are built here
# from bench/sampler_rows.cpp with the flags the sampler's files get in the real build.
#   bench/sampler_rows_ab.sh [REV]     (run from the repository root after scripts/build)
set -euo pipefail
rev="${1:-b5a9b74}"
old_src=$(mktemp -d)
trap 'rm -rf "$old_src"' EXIT
# The sampler lived in engine/runtime/sampler*.cpp before it had engine/sample/ of its own.
if git cat-file -e "$rev:engine/sample" 2>/dev/null; then old_dir=engine/sample old_glob="*.cpp"; else old_dir=engine/runtime old_glob="sampler*.cpp"; fi
git archive "$rev" "$old_dir" engine/include/kvfleet/sampler.h | tar -x -C "$old_src"
flags=(-std=c++20 -O3 -march=x86-64-v3 -DNDEBUG -ffp-contract=off -fno-trapping-math -Ikernels/include -I.deps/include)
libs=(build/lib/libkvfleet_kernels_cpu.a build/lib/libkvfleet_core.a)
old_flags=()
grep -q next_row "$old_src/engine/include/kvfleet/sampler.h" || old_flags=(-DKVFLEET_NO_NEXT_ROW)
g++ "${flags[@]}" "${old_flags[@]}" -I"$old_src" -I"$old_src/engine/include" -I. -Iengine/include bench/sampler_rows.cpp \
  "$old_src/$old_dir"/$old_glob -o "$old_src/rows_old" "${libs[@]}"
g++ "${flags[@]}" -I. -Iengine/include bench/sampler_rows.cpp engine/sample/*.cpp -o "$old_src/rows_new" "${libs[@]}"
uptime
echo "mode | vocab | logit std | old | new | old | new (us/row, CPU)"
while read -r name t tp tk mp; do
  for v in 8192 32000; do
    for sd in 0.5 2; do
      a=() && for b in old new old new; do a+=("$("$old_src/rows_$b" "$v" "$sd" "$t" "$tp" "$tk" "$mp" | cut -d' ' -f1)"); done
      echo "$name | $v | $sd | ${a[0]} | ${a[1]} | ${a[2]} | ${a[3]}"
    done
  done
done <<MODES
greedy 0 1 0 0
temperature_1 1 1 0 0
t0.7_top_p0.9 0.7 0.9 0 0
top_k50 1 1 50 0
min_p0.05 1 1 0 0.05
MODES
uptime
