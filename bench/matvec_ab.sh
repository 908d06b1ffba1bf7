#!/usr/bin/env bash
# The CPU linear kernels of two builds side by side: runs `bench_matvec --kernels-only 1` of an older build
# (BASE_DIR/bench_matvec) and of this one (build/bin/bench_matvec) alternately, PAIRS times each (A, B,
# A, B: on a shared machine the load drifts), and prints per shape and row count the best GFLOP/s of each
# and their ratio. The one-row lines are the GEMV from L2 (3 MiB of weights); "gemv" is the GEMV from
# memory (512 MiB). Columns: each build's plain rows, and this build's packed panels against the old
# build's plain rows. (Builds from before the reference kernel was dropped print it first: it is skipped.)
#
#   bench/matvec_ab.sh BASE_DIR [PAIRS=3] [ROUNDS=4]
#   e.g. bench/matvec_ab.sh /work/baseline-gemm 3
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
base=${1:?usage: bench/matvec_ab.sh BASE_DIR [PAIRS] [ROUNDS]}
pairs=${2:-3} rounds=${3:-4}
work=$(mktemp -d /tmp/kvfleet-matvec-ab.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 0; i < pairs; i++)); do
  "$base/bench_matvec" --kernels-only 1 --rounds "$rounds" > "$work/old_$i.txt"
  "$here/build/bin/bench_matvec" --kernels-only 1 --rounds "$rounds" > "$work/new_$i.txt"
done
python3 - "$work" "$pairs" <<'PY'
import re, sys
work, pairs = sys.argv[1], int(sys.argv[2])
def parse(path):
    r, shape, skip = {}, None, 0
    for line in open(path):
        m = re.match(r'one thread, CPU time, bf16 (\d+) -> (\d+): (.*)', line)
        if m:
            shape = f'{m.group(1)}->{m.group(2)}'
            skip = 1 if m.group(3).startswith('old kernel') else 0  # an older build's reference column
            continue
        m = re.match(r'\s+rows\s+(\d+):([^G]*)GFLOP/s', line)
        if m:  # (reference,) plain, packed, ...
            cols = [float(c) for c in m.group(2).split('|')][skip:]
            r[(shape, int(m.group(1)))] = (cols[0], cols[1])
            continue
        m = re.match(r'.*GEMV over \d+ MiB: (?:old kernel [\d.]+ GB/s \| today.s|plain) ([\d.]+) GB/s(?: \| packed ([\d.]+))?', line)
        if m:  # the oldest builds print no packed GEMV: their plain one stands in
            r[('gemv', 1)] = (float(m.group(1)), float(m.group(2) or m.group(1)))
    return r
old = [parse(f'{work}/old_{i}.txt') for i in range(pairs)]
new = [parse(f'{work}/new_{i}.txt') for i in range(pairs)]
# Each build's plain column, then new's packed panels (the CPU backend's default layout) against old's plain
# rows (what the oldest builds ran by default).
print('shape       rows   old plain -> new plain, new packed (GFLOP/s; gemv: GB/s)   new/old plain, packed')
for k in old[0]:
    bo, bn, bp = max(o[k][0] for o in old), max(n[k][0] for n in new), max(n[k][1] for n in new)
    print(f'{k[0]:>10} {k[1]:5d}   {bo:8.1f} -> {bn:8.1f} {bp:8.1f}   {bn / bo:5.2f}x {bp / bo:5.2f}x')
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
