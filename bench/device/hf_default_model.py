#!/usr/bin/env python3
"""Parity of kvfleet against Hugging Face transformers on the trained default model
(models/kvfleet-default), run by run_parity.sh after hf_parity.py's random-weight variants.

    python3 bench/device/hf_default_model.py --bin build/bin --out $OUT [--model DIR] [--hf-device cpu]

Checks, each against transformers (AutoModelForCausalLM, float32, eager attention):
  tokenizer  - tokenizers' encoding of eval/heldout.txt equals eval/reference.json's ids (our trainer's)
  logits     - `kvfleet logits` on the first 64 held-out ids: max|diff| / max|logit| < 1e-4
  perplexity - `kvfleet perplexity --file eval/heldout.txt --context C` vs transformers' windowed NLL
               (same windows: see engine/include/kvfleet/perplexity.h): relative difference < 1e-3
  greedy     - transformers' greedy continuation of each opening equals reference.json's
Writes $OUT/default_model_parity.json. Exit 0 all pass, 1 a miss or error.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_hf(model_dir, device):
    import torch
    import transformers
    cls = transformers.AutoModelForCausalLM
    model = None
    for kwargs in ({"dtype": torch.float32, "attn_implementation": "eager"},
                   {"torch_dtype": torch.float32, "attn_implementation": "eager"}, {}):
        try:
            model = cls.from_pretrained(model_dir, **kwargs)
            break
        except TypeError:
            continue
    return model.float().to(device).eval()


def hf_logits(model, ids):
    import torch
    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0]
    return out.double().cpu().numpy()


def hf_window_nll(model, ids, context):
    total, count = 0.0, 0
    for start in range(0, len(ids), context):
        w = ids[start:start + context]
        if len(w) < 2:
            continue
        logits = hf_logits(model, w)
        m = logits.max(axis=-1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
        total -= float(sum(logp[i, w[i + 1]] for i in range(len(w) - 1)))
        count += len(w) - 1
    return total, count


def hf_greedy(model, ids, n):
    out = list(ids)
    for _ in range(n):
        out.append(int(np.argmax(hf_logits(model, out)[-1])))
    return out[len(ids):]


def run_kvfleet(exe, args):
    proc = subprocess.run([exe] + args, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError("kvfleet %s exited %d: %s" % (args[0], proc.returncode, proc.stderr[-800:]))
    return json.loads(proc.stdout.strip().splitlines()[-1] if args[0] == "perplexity" else proc.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "parity"))
    p.add_argument("--model", default=os.path.join(ROOT, "models", "kvfleet-default"))
    p.add_argument("--hf-device", default="cpu")
    args = p.parse_args()
    ref = json.load(open(os.path.join(args.model, "eval", "reference.json"), encoding="utf-8"))
    heldout_path = os.path.join(args.model, "eval", ref["heldout_file"])
    heldout = open(heldout_path, encoding="utf-8").read()
    ids, context = ref["heldout_ids"], ref["context"]
    exe = os.path.join(args.bin, "kvfleet")
    res = {"model": args.model}
    try:
        import tokenizers
        enc = tokenizers.Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
        hf_ids = enc.encode(heldout, add_special_tokens=False).ids
        res["tokenizer"] = {"pass": hf_ids == ids, "tokens": len(hf_ids)}
    except Exception as e:  # noqa: BLE001 - reported, and it fails the run
        res["tokenizer"] = {"pass": False, "error": "%s: %s" % (type(e).__name__, e)}
    try:
        model = load_hf(args.model, args.hf_device)
        hf = hf_logits(model, ids[:64])
        kv = np.asarray(run_kvfleet(exe, ["logits", "--model", args.model, "--ids",
                                          ",".join(map(str, ids[:64]))])["logits"], dtype=np.float64)
        ratio = float(np.max(np.abs(kv - hf)) / np.max(np.abs(hf)))
        res["logits"] = {"ratio": ratio, "pass": ratio < 1e-4}
        nll, count = hf_window_nll(model, ids, context)
        hf_ppl = math.exp(nll / count)
        kv_ppl = run_kvfleet(exe, ["perplexity", "--model", args.model, "--file", heldout_path,
                                   "--context", str(context)])["perplexity"]
        rel = abs(kv_ppl - hf_ppl) / hf_ppl
        res["perplexity"] = {"transformers": hf_ppl, "kvfleet": kv_ppl, "trainer": ref["perplexity"],
                             "rel_diff": rel, "pass": rel < 1e-3}
        res["greedy"] = []
        for g in ref["greedy"]:
            got = hf_greedy(model, g["prompt_ids"], len(g["continuation_ids"]))
            res["greedy"].append({"prompt": g["prompt"], "pass": got == g["continuation_ids"]})
    except Exception as e:  # noqa: BLE001
        res["error"] = "%s: %s" % (type(e).__name__, e)
    checks = [res.get(k, {}).get("pass", False) for k in ("tokenizer", "logits", "perplexity")]
    checks += [g["pass"] for g in res.get("greedy", [])] or [False]
    res["ok"] = all(checks) and "error" not in res
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "default_model_parity.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("default model parity:", json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
