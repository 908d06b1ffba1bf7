#!/usr/bin/env bash
# Manual trial (not part of CI; needs Debian's `prometheus` package, which scripts/setup does not install):
# a real Prometheus server scrapes a real kvfleet-replica on loopback (ports 18765 and 19090) while three
# long requests run on a one-sequence replica, and is queried for the vLLM names the Gateway API Inference
# Extension's endpoint picker reads; promtool parses the scrape with Prometheus' Go text parser.
# Usage: scripts/manifests/prometheus_trial.sh [BUILD/bin]. Stops everything it started.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="${1:-$root/build/bin}"
command -v prometheus >/dev/null || { echo "needs Debian's prometheus package (apt-get install prometheus)"; exit 1; }
w=$(mktemp -d)
"$bin/kvfleet" make-model --arch qwen2 --layers 2 --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --seed 1 \
  --tokenizer "$root/models/kvfleet-default" --out "$w/tiny" >/dev/null
"$bin/kvfleet-replica" --model "$w/tiny" --served-model-name kvfleet --host 127.0.0.1 --port 18765 --backend cpu \
  --cpu-threads 1 --max-num-seqs 1 --num-kv-blocks 256 >"$w/replica.log" 2>&1 &
rpid=$!
cat >"$w/prom.yml" <<YML
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: kvfleet
    static_configs: [{targets: ["127.0.0.1:18765"]}]
YML
prometheus --config.file="$w/prom.yml" --storage.tsdb.path="$w/data" --web.listen-address=127.0.0.1:19090 >"$w/prom.log" 2>&1 &
ppid=$!
for i in $(seq 1 100); do curl -sf http://127.0.0.1:18765/health >/dev/null && break; sleep 0.2; done
echo "== promtool check metrics (the Go exposition parser the endpoint picker uses):"
curl -s http://127.0.0.1:18765/metrics | promtool check metrics; echo "promtool rc=$?"
body='{"prompt":"A long story:","max_tokens":3000,"stream":true,"ignore_eos":true}'
for k in 1 2 3; do timeout 20 curl -sN -H 'Content-Type: application/json' -d "$body" http://127.0.0.1:18765/v1/completions >/dev/null & done
sleep 6
echo "== replica /metrics now:"
curl -s http://127.0.0.1:18765/metrics | grep -E '^(vllm:|kvfleet_requests_(running|waiting)|kvfleet_kv_cache_usage_ratio)'
echo "== Prometheus queries:"
for q in vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc vllm:cache_config_info; do
  curl -s "http://127.0.0.1:19090/api/v1/query?query=$q"; echo
done
kill $rpid $ppid 2>/dev/null
wait
rm -rf "$w"
