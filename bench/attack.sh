#!/usr/bin/env bash
# Real attack tools against kvfleet-router (a real replica of the default model behind it), each attack
# with a second client measuring what others get meanwhile. Figures: docs/reliability.md, "Attack tools".
#
#   slowloris   slowhttptest -H: CONNS connections from 127.0.0.1 send a header line every 10 s, never
#               finishing; a second client (curl from 127.0.0.2, another address to the router) times
#               GET /v1/models every 100 ms.
#   slowbody    slowhttptest -B: the same with bodies that trickle in.
#   slowread    slowhttptest -X: responses read a few bytes at a time.
#   flood       wrk (or hey) with CONNS connections on /v1/models while curl times /health: probes must
#               not queue behind the flood.
#   h2load      h2load --h1, ROUNDS rounds of REQUESTS requests on CONNS connections; errors and the
#               router's RSS after each round.
#
#   bench/attack.sh [ATTACK...]   (default: all; needs build/bin: kvfleet-replica, kvfleet-router)
#   CONNS=5000 ATTACK_SECONDS=30 REQUESTS=155000 ROUNDS=3 bench/attack.sh slowloris flood
#
# It installs nothing. Missing tools are named with the Debian package that has them, and their attacks
# are skipped. The flood and h2load attacks come from one address, so the router runs them with
# --max-connections-per-peer 0 (a load test from one machine); the slow attacks use the default cap.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KVFLEET_BIN:-$root/build/bin}"
conns=${CONNS:-5000}
secs=${ATTACK_SECONDS:-30}
requests=${REQUESTS:-155000}
rounds=${ROUNDS:-3}
model="${MODEL:-$root/models/kvfleet-default}"
attacks=("$@")
[ ${#attacks[@]} -eq 0 ] && attacks=(slowloris slowbody slowread flood h2load)

declare -A package=([slowhttptest]=slowhttptest [h2load]=nghttp2-client [wrk]=wrk [hey]=hey [curl]=curl)
missing=()
for tool in slowhttptest h2load wrk hey curl; do command -v "$tool" >/dev/null || missing+=("${package[$tool]}"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[attack] not installed: ${missing[*]}; to run every attack: apt-get install ${missing[*]}" >&2
fi
have() { command -v "$1" >/dev/null; }
have curl || { echo "[attack] curl is needed for the second client" >&2; exit 1; }

work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
wait_url() { for _ in $(seq 1 600); do grep -o 'http://[0-9.]*:[0-9]*' "$1" 2>/dev/null | head -n 1 && return; sleep 0.1; done; cat "$1"; exit 1; }
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "[attack] descriptors: $(ulimit -n); connections per attack: $conns" >&2

"$bin/kvfleet-replica" --model "$model" --port 0 --backend cpu --cpu-threads 1 >"$work/replica.log" 2>&1 & pids+=($!)
replica=$(wait_url "$work/replica.log")
router_pid=
start_router() {  # extra flags
  if [ -n "$router_pid" ]; then kill "$router_pid"; wait "$router_pid" 2>/dev/null || true; fi
  "$bin/kvfleet-router" --model "$model" --replica "$replica" --port 0 "$@" >"$work/router.log" 2>&1 &
  router_pid=$!; pids+=($router_pid)
  router=$(wait_url "$work/router.log")
  port=${router##*:}
  for _ in $(seq 1 100); do curl -sf "$router/health" >/dev/null && return; sleep 0.1; done
}
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$router_pid/status"; }

# The second client: GET $1 from 127.0.0.2 every 100 ms for $2 seconds; prints count, failures, p50/p90/max ms.
probe() {
  local out="$work/probe.txt"; : >"$out"
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    curl -s -o /dev/null --interface 127.0.0.2 --max-time 10 -w '%{http_code} %{time_total}\n' \
      "http://127.0.0.1:$port$1" >>"$out" || echo "000 10" >>"$out"
    sleep 0.1
  done
  python3 - "$out" "$1" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
ok = sorted(float(t) * 1000 for c, t in rows if c == "200")
codes = {}
for c, _ in rows:
    if c != "200": codes[c] = codes.get(c, 0) + 1
bad = ", ".join(f"{n} x {'no answer in 10 s' if c == '000' else c}" for c, n in sorted(codes.items())) or "all 200"
pct = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] if ok else float("nan")
print(f"  second client GET {sys.argv[2]}: {len(rows)} requests ({bad}), "
      f"p50 {pct(0.5):.1f} ms, p90 {pct(0.9):.1f} ms, max {max(ok) if ok else float('nan'):.1f} ms")
PY
}

slow() {  # name slowhttptest-mode-flag verb path
  have slowhttptest || { echo "[attack] $1: skipped (apt-get install slowhttptest)"; return; }
  start_router
  echo "[attack] $1: slowhttptest $2 -c $conns for ${secs}s ($3 $4)"
  slowhttptest "$2" -c "$conns" -r 1000 -i 10 -l "$secs" -t "$3" -u "http://127.0.0.1:$port$4" \
    -x 24 -p 3 -n 1 -k 3 -w 10 -y 20 >"$work/$1.log" 2>&1 & local attacker=$!
  sleep 5  # the attack has opened its connections
  probe /v1/models $((secs - 8))
  wait "$attacker" 2>/dev/null || true
  grep -E "closed:|pending:|connected:|error:|service available:" "$work/$1.log" | tail -n 5 | sed 's/\x1b\[[0-9;]*m//g; s/^/  slowhttptest /'
  echo "  router RSS $(rss_kib) KiB"
}

flood() {
  start_router --max-connections-per-peer 0
  if have wrk; then
    echo "[attack] flood: wrk -c $conns -d ${secs}s on /v1/models"
    wrk -t 2 -c "$conns" -d "${secs}s" "http://127.0.0.1:$port/v1/models" >"$work/flood.log" 2>&1 & local flooder=$!
  elif have hey; then
    echo "[attack] flood: hey -c $conns -z ${secs}s on /v1/models"
    hey -c "$conns" -z "${secs}s" "http://127.0.0.1:$port/v1/models" >"$work/flood.log" 2>&1 & local flooder=$!
  else
    echo "[attack] flood: skipped (apt-get install wrk, or hey)"; return
  fi
  sleep 3
  probe /health $((secs - 5))
  wait "$flooder" 2>/dev/null || true
  grep -E "Requests/sec|Socket errors|Non-2xx|requests in|Status code|\[[0-9]+\]" "$work/flood.log" | sed 's/^/  /'
}

h2load_rounds() {
  have h2load || { echo "[attack] h2load: skipped (apt-get install nghttp2-client)"; return; }
  start_router --max-connections-per-peer 0
  echo "[attack] h2load: $rounds x $requests requests on $conns connections (/v1/models); RSS before $(rss_kib) KiB"
  for r in $(seq 1 "$rounds"); do
    h2load --h1 -n "$requests" -c "$conns" "http://127.0.0.1:$port/v1/models" >"$work/h2load.log" 2>&1 || true
    echo "  round $r: $(grep -E '^requests:' "$work/h2load.log" | sed 's/  */ /g'); RSS $(rss_kib) KiB"
  done
}

for a in "${attacks[@]}"; do
  case "$a" in
    slowloris) slow slowloris -H GET /v1/models ;;
    slowbody) slow slowbody -B POST /v1/completions ;;
    slowread) slow slowread -X GET /v1/models ;;
    flood) flood ;;
    h2load) h2load_rounds ;;
    *) echo "[attack] unknown attack '$a' (slowloris slowbody slowread flood h2load)" >&2; exit 2 ;;
  esac
done
