#!/usr/bin/env bash
# Flow control in kvfleet-router: what a flooding tenant does to another tenant's time to first token.
# One replica on the default model, the router in front with max_concurrency equal to the replica's
# max_num_seqs (so requests beyond what the replica runs at once wait in the router's waiting room).
# Tenant "light" sends at RATE req/s (16 output tokens each); tenant "flood" at 10x RATE (256 output tokens
# each), more than the replica can serve. Three
# phases in one run, the light tenant's workload identical in each (same seed):
#   alone   - light only
#   fair    - light and flood as two tenants (flow control shares the slots)
#   shared  - light and flood under one tenant name (first come, first served: no flow control)
# and the light tenant's TTFT p50/p99 in each, with the ratios to `alone`.
#
#   bench/flow_control.sh [RATE=1] [SECONDS=40] [SLOTS=4]   (needs build/bin: kvfleet-replica, kvfleet-router, kvfleet-bench)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KVFLEET_BIN:-$root/build/bin}"
rate=${1:-1}
secs=${2:-40}
slots=${3:-4}
model="$root/models/kvfleet-default"
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
wait_url() { for _ in $(seq 1 600); do grep -o 'http://[0-9.]*:[0-9]*' "$1" 2>/dev/null | head -n 1 && return; sleep 0.1; done; cat "$1"; exit 1; }

"$bin/kvfleet-replica" --model "$model" --port 0 --backend cpu --cpu-threads 1 --max-num-seqs "$slots" \
  >"$work/replica.log" 2>&1 & pids+=($!)
replica=$(wait_url "$work/replica.log")
"$bin/kvfleet-router" --model "$model" --replica "$replica" --port 0 --max-concurrency "$slots" --max-queue 100000 \
  >"$work/router.log" 2>&1 & pids+=($!)
router=$(wait_url "$work/router.log")

light_n=$(python3 -c "print(max(10, int($rate * $secs)))")
flood_n=$(python3 -c "print(int(10 * $rate * $secs))")
flood_rate=$(python3 -c "print(10 * $rate)")
serve() {  # tenant rate n seed out output_len
  "$bin/kvfleet-bench" serve --base-url "$router" --model "$model" --dataset-name random --random-input-len 128 \
    --random-output-len "$6" --num-prompts "$3" --request-rate "$2" --seed "$4" --header "x-kvfleet-tenant:$1" \
    --num-warmups 2 --result-file "$5" >"$5.log" 2>&1
}
phase() {  # name flood_tenant (empty: no flood)
  echo "[bench] phase $1" >&2
  if [ -n "$2" ]; then
    serve "$2" "$flood_rate" "$flood_n" 7 "$work/$1-flood.json" 256 & local flood=$!
    sleep 3  # the flood has filled the slots and the waiting room before the light tenant starts
  fi
  serve light "$rate" "$light_n" 1 "$work/$1-light.json" 16
  if [ -n "$2" ]; then kill "$flood" 2>/dev/null || true; wait "$flood" 2>/dev/null || true; fi
  # Let the replica drain what the flood left running.
  for _ in $(seq 1 600); do
    q=$(curl -s "$router/admin/replicas" | python3 -c 'import json,sys; print(json.load(sys.stdin)["active"])' 2>/dev/null || echo 1)
    [ "$q" = "0" ] && break; sleep 0.2
  done
}
phase alone ""
phase fair flood
phase shared light

python3 - "$work" "$rate" "$slots" <<'PY'
import json, sys
work, rate, slots = sys.argv[1], sys.argv[2], sys.argv[3]
r = {p: json.load(open(f"{work}/{p}-light.json")) for p in ("alone", "fair", "shared")}
print(f"light tenant at {rate} req/s, flood at 10x; router max_concurrency = replica max_num_seqs = {slots}")
print("| phase | light TTFT p50 ms | light TTFT p99 ms | p99 / alone | light completed |")
print("|---|---|---|---|---|")
for p in ("alone", "fair", "shared"):
    x = r[p]
    print(f"| {p} | {x['median_ttft_ms']:.0f} | {x['p99_ttft_ms']:.0f} | {x['p99_ttft_ms'] / r['alone']['p99_ttft_ms']:.2f}x | {x['completed']} |")
PY
