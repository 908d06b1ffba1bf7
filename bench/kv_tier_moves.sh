#!/usr/bin/env bash
# Block moves of the KV tiers against the machine's own limits, in one run: the host tier's move rate
# against memcpy of the same bytes, the cold disk tier's against fio's sequential read of a file of the same
# size in the same file system (page cache dropped first). Move rates come from bench_kv_tiers (a returning
# 4k-token conversation: bytes brought back over the time its return took beyond a device hit's).
#   bench/kv_tier_moves.sh [TOKENS] [REPS]      (default 4096 5; needs build/bin/bench_kv_tiers and fio)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tokens=${1:-4096}
reps=${2:-5}
command -v fio >/dev/null || { echo "[moves] fio is not installed: apt-get install fio" >&2; exit 1; }
[ -x "$root/build/bin/bench_kv_tiers" ] || { echo "[moves] no build/bin/bench_kv_tiers: run scripts/build" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvfleet-moves-XXXXXX")
trap 'rm -rf "$dir"' EXIT
bytes=$(( tokens / 16 * 128 * 1024 ))  # the default model's 128 KiB blocks
echo "[moves] fio: sequential read of $((bytes >> 20)) MiB in 128 KiB reads, page cache dropped" >&2
fio_json=$(fio --name=seqread --directory="$dir" --size="$bytes" --bs=128k --rw=read --ioengine=psync \
  --invalidate=1 --direct=0 --loops=3 --output-format=json 2>/dev/null)
echo "[moves] bench_kv_tiers --tokens $tokens --reps $reps" >&2
bench_json=$(TMPDIR="$dir" "$root/build/bin/bench_kv_tiers" --tokens "$tokens" --reps "$reps" 2>/dev/null)
python3 - "$fio_json" "$bench_json" <<'PY'
import json, sys
fio = json.loads(sys.argv[1])["jobs"][0]["read"]["bw_bytes"] / 1e9
b = json.loads(sys.argv[2])
rows = [("host -> device", b["host"]["move_gbps"], "memcpy", b["memcpy_gbps"]),
        ("disk (page cache) -> device", b["disk"]["move_gbps"], "memcpy", b["memcpy_gbps"]),
        ("disk (cold) -> device", b["disk_cold"]["move_gbps"], "fio sequential read", fio)]
print("| move | GB/s | limit | GB/s | share of the limit |")
print("| --- | --- | --- | --- | --- |")
for what, gbps, limit, lgbps in rows:
    print(f"| {what} | {gbps:.2f} | {limit} | {lgbps:.2f} | {gbps / lgbps:.2f} |")
PY
