#!/usr/bin/env python3
"""Logit parity of `kvfleet logits` (and of tests/reference/llama_ref.py) against Hugging Face
transformers, on small random-weight models that transformers itself writes.

Usage (normally through run_parity.sh):
    python3 bench/device/hf_parity.py --bin build/bin --out $OUT [--only NAME ...]
        [--hf-device cpu|cuda] [--kvfleet-args="--backend cuda"] [--compare-backend cpu]
        [--keep-models]
(--kvfleet-args takes one string, split like a shell would; write it with '=' when it starts
with a dash.)

Needs torch and transformers (written for torch 2.11 / transformers 5.x, tolerant of 4.4x+) and
numpy; no network. For every variant it builds the model with XForCausalLM._from_config, gives
every parameter (norm weights and biases included) random values, saves it with
save_pretrained, computes transformers' logits (eval, no_grad, eager attention) and compares:
  kvfleet   - `$BIN/kvfleet logits --model DIR --ids a,b,c` (stdout JSON {"logits": [[...]...]})
  reference - llama_ref.py (float64 numpy, independent of both)
Writes $OUT/parity.json and prints a table. Exit status: 0 when every float32 variant (kvfleet
and reference) is within max|diff| / max|logit| < 1e-4, 1 when one misses, 2 when kvfleet could
not be run at all. bf16 variants are reported, never gating (bf16 activations in transformers
differ from fp32 accumulation by design).
--compare-backend B also runs `kvfleet logits` with `--backend B` (replacing any --backend in
--kvfleet-args) and compares the greedy choice (argmax) at every position: a disagreement where B's
top two logits are closer than TOLERANCE * max|logit| is a near-tie and only counted; any other
fails the variant (a float32 one gates the exit status).
"""

import argparse
import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import llama_ref  # noqa: E402

TOLERANCE = 1e-4
SEQ_LENS = (1, 6, 37)  # 37 crosses two 16-token KV blocks

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # small: all three frequency bands are hit

# name, architecture, dtype, config fields, max_shard_size (None: one file)
VARIANTS = [
    ("llama_gqa_untied", "llama", "float32",
     dict(vocab_size=32000, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
          num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False), "4MB"),
    ("llama_mha_tied", "llama", "float32",
     dict(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
          num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True), None),
    ("qwen2_qkv_bias", "qwen2", "float32",
     dict(vocab_size=3000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
          tie_word_embeddings=False), None),
    ("llama3_rope_head_dim", "llama", "float32",
     dict(vocab_size=2000, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=500000.0,
          rope_scaling=LLAMA3, tie_word_embeddings=False), None),
    ("mistral", "mistral", "float32",
     dict(vocab_size=4000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
          num_attention_heads=8, num_key_value_heads=2, rope_theta=1e6, sliding_window=4096,
          tie_word_embeddings=False), None),
    ("llama_linear_rope_bias", "llama", "float32",
     dict(vocab_size=1500, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
          rope_scaling={"rope_type": "linear", "factor": 4.0}, tie_word_embeddings=False), None),
    ("llama_gqa_untied", "llama", "bfloat16", None, None),  # same fields as the fp32 one
    ("qwen2_qkv_bias", "qwen2", "bfloat16", None, None),
]


def variant_list():
    fields = {name: (f, shard) for name, _, _, f, shard in VARIANTS if f is not None}
    out = []
    for name, arch, dtype, f, shard in VARIANTS:
        f, shard = (f, shard) if f is not None else fields[name]
        out.append({"name": name + ("_bf16" if dtype == "bfloat16" else "_f32"), "arch": arch,
                    "dtype": dtype, "fields": f, "max_shard_size": shard})
    return out


# ---------------------------------------------------------------------------------------------
# transformers side (imported lazily so --help works without torch)
# ---------------------------------------------------------------------------------------------

def hf_classes(arch):
    import transformers
    names = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
             "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
             "mistral": ("MistralConfig", "MistralForCausalLM")}[arch]
    return getattr(transformers, names[0]), getattr(transformers, names[1])


def make_config(config_cls, fields):
    """transformers 5 keeps rope_theta and the scaling dict in one rope_parameters dict;
    4.x takes rope_theta and rope_scaling. Pick by the constructor's signature, or, for v5's
    dataclass-style configs whose __init__ only shows **kwargs, by a default instance."""
    fields = dict(fields)
    theta = fields.pop("rope_theta", 10000.0)
    scaling = fields.pop("rope_scaling", None)
    params = inspect.signature(config_cls.__init__).parameters
    if "rope_parameters" in params or hasattr(config_cls(), "rope_parameters"):
        rope = dict(scaling or {"rope_type": "default"})
        rope["rope_theta"] = theta
        fields["rope_parameters"] = rope
    else:
        fields["rope_theta"] = theta
        fields["rope_scaling"] = scaling
    fields.setdefault("max_position_embeddings", 2048)
    cfg = config_cls(**fields)
    try:
        cfg._attn_implementation = "eager"
    except AttributeError:  # no setter in this version; _from_config gets it as a kwarg too
        pass
    return cfg


def build_model(arch, dtype_name, fields, seed):
    import torch
    config_cls, model_cls = hf_classes(arch)
    cfg = make_config(config_cls, fields)
    dtype = getattr(torch, dtype_name)
    model = None
    # dtype= is the v5 name, torch_dtype= the 4.x one; an unknown kwarg reaches the model's
    # __init__ and raises TypeError, so try the spellings in turn.
    attempts = [dict(a, **d) for a in ({"attn_implementation": "eager"}, {})
                for d in ({"dtype": dtype}, {"torch_dtype": dtype}, {})]
    for kwargs in attempts:
        try:
            model = model_cls._from_config(cfg, **kwargs)
            break
        except TypeError:
            continue
    if model is None:
        model = model_cls(cfg)
    model = model.to(dtype)
    if getattr(model.config, "_attn_implementation", "eager") != "eager":
        try:
            model.set_attn_implementation("eager")
        except AttributeError:  # before 4.56; the result records what was used
            pass
    randomize(model, seed)
    if fields.get("tie_word_embeddings"):
        check_tied(model)
    return model.eval()


def check_tied(model):
    """The saved file has no lm_head when tied; transformers' own logits must use the
    (randomised) embedding too, or the comparison would be meaningless."""
    def same():
        return (model.get_output_embeddings().weight.data_ptr()
                == model.get_input_embeddings().weight.data_ptr())
    if not same():
        model.tie_weights()
    if not same():
        raise RuntimeError("tie_word_embeddings is set but lm_head is not the embedding")


def randomize(model, seed):
    """transformers initialises norms to 1 and biases to 0, which would hide a missing bias or
    norm weight; give everything values of a realistic scale instead."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights are listed once
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * r
            elif name.endswith(".bias"):
                value = 0.3 * r
            elif "embed_tokens" in name or p.dim() != 2:
                value = r
            else:
                value = r / (p.shape[1] ** 0.5)
            p.copy_(value.to(p.dtype))


def save_model(model, path, max_shard_size):
    kwargs = {}
    params = inspect.signature(model.save_pretrained).parameters
    if "safe_serialization" in params:  # removed in v5, where safetensors is the only format
        kwargs["safe_serialization"] = True
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **kwargs)
    if not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise RuntimeError("save_pretrained wrote no .safetensors file in %s" % path)


def hf_logits(model, id_lists, device):
    import torch
    model = model.to(device)
    out = []
    with torch.no_grad():
        for ids in id_lists:
            t = torch.tensor([ids], dtype=torch.long, device=device)
            logits = model(input_ids=t, use_cache=False).logits[0]
            out.append(logits.float().cpu().numpy().astype(np.float64))
    return out


def hf_inv_freq_gap(model, model_dir):
    """Relative gap between transformers' rotary inv_freq and llama_ref's (diagnostic only)."""
    try:
        hf = model.model.rotary_emb.inv_freq.detach().double().cpu().numpy()
    except AttributeError:
        return None
    ref = llama_ref.rope_inv_freq(llama_ref.load_config(model_dir))
    if hf.shape != ref.shape:
        return float("inf")
    return float(np.max(np.abs(hf - ref)) / np.max(np.abs(ref)))


# ---------------------------------------------------------------------------------------------
# kvfleet side
# ---------------------------------------------------------------------------------------------

def parse_logits_json(text, positions):
    """{"logits": [[vocab floats] per position]}; log lines around the JSON are tolerated."""
    doc = None
    try:
        doc = json.loads(text)
    except ValueError:
        for line in reversed(text.splitlines()):
            if line.lstrip().startswith("{"):
                try:
                    doc = json.loads(line)
                    break
                except ValueError:
                    continue
    if not isinstance(doc, dict) or "logits" not in doc:
        raise ValueError("no {\"logits\": ...} JSON object in stdout (%d bytes)" % len(text))
    arr = np.asarray(doc["logits"], dtype=np.float64)
    if arr.ndim == 3 and arr.shape[0] == 1:  # tolerate one extra batch level
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] != positions:
        raise ValueError("logits shape %s, expected (%d, vocab)" % (arr.shape, positions))
    return arr


def kvfleet_logits(exe, model_dir, id_lists, extra_args, timeout):
    out = []
    for ids in id_lists:
        cmd = [exe, "logits", "--model", model_dir, "--ids", ",".join(map(str, ids))] + extra_args
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError("%s exited %d; stderr tail: %s"
                               % (shlex.join(cmd), proc.returncode, proc.stderr[-1500:]))
        out.append(parse_logits_json(proc.stdout, len(ids)))
    return out


# ---------------------------------------------------------------------------------------------
# comparison and report
# ---------------------------------------------------------------------------------------------

def compare(test, truth):
    """max|test - truth|, max|truth|, their ratio and argmax agreement over all positions."""
    max_diff, max_logit, agree, positions = 0.0, 0.0, 0, 0
    for a, b in zip(test, truth):
        if a.shape != b.shape:
            raise ValueError("shape %s vs %s" % (a.shape, b.shape))
        max_diff = max(max_diff, float(np.max(np.abs(a - b))))
        max_logit = max(max_logit, float(np.max(np.abs(b))))
        agree += int(np.sum(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
        positions += a.shape[0]
    return {"max_abs_diff": max_diff, "max_abs_logit": max_logit,
            "ratio": max_diff / max_logit if max_logit > 0 else float("inf"),
            "argmax_agree": agree / positions if positions else 0.0, "positions": positions}


def with_backend(extra_args, backend):
    """extra_args with any --backend X / --backend=X replaced by --backend `backend`."""
    out, skip = [], False
    for a in extra_args:
        if skip:
            skip = False
        elif a == "--backend":
            skip = True
        elif not a.startswith("--backend="):
            out.append(a)
    return out + ["--backend", backend]


def greedy_compare(test, other):
    """Argmax of `test` vs `other` at every position; disagreements at a near-tie of `other`'s top
    two logits (gap < TOLERANCE * max|logit| of that row) are counted apart from clear ones."""
    agree, near_tie, clear = 0, 0, 0
    for a, b in zip(test, other):
        for ra, rb in zip(a, b):
            if int(np.argmax(ra)) == int(np.argmax(rb)):
                agree += 1
                continue
            top2 = np.sort(rb)[-2:]
            if top2[1] - top2[0] < TOLERANCE * float(np.max(np.abs(rb))):
                near_tie += 1
            else:
                clear += 1
    return {"agree": agree, "near_tie": near_tie, "clear": clear,
            "positions": agree + near_tie + clear}


def run_variant(v, args, work_dir, kvfleet_exe):
    import zlib
    import torch
    seed = zlib.crc32(v["name"].encode()) & 0x7FFFFFFF
    start = time.time()
    res = {"name": v["name"], "arch": v["arch"], "dtype": v["dtype"], "fields": v["fields"]}
    model = build_model(v["arch"], v["dtype"], v["fields"], seed)
    res["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    path = os.path.join(work_dir, v["name"])
    save_model(model, path, v["max_shard_size"])
    res["files"] = sorted(os.listdir(path))
    res["rope_inv_freq_rel_gap"] = hf_inv_freq_gap(model, path)
    rng = np.random.default_rng(seed)
    id_lists = [rng.integers(0, v["fields"]["vocab_size"], n).tolist() for n in SEQ_LENS]
    res["ids"] = id_lists
    hf = hf_logits(model, id_lists, args.hf_device)
    ref = llama_ref.run(path, id_lists)
    res["reference_vs_hf"] = compare(ref, hf)
    if v["dtype"] == "float32":
        hf64 = hf_logits(model.to(torch.float64), id_lists, args.hf_device)
        res["reference_vs_hf_fp64"] = compare(ref, hf64)
    if kvfleet_exe:
        try:
            kv = kvfleet_logits(kvfleet_exe, path, id_lists, shlex.split(args.kvfleet_args),
                                args.kvfleet_timeout)
            res["kvfleet_vs_hf"] = compare(kv, hf)
            res["kvfleet_vs_reference"] = compare(kv, ref)
            if args.compare_backend:
                other = kvfleet_logits(kvfleet_exe, path, id_lists,
                                       with_backend(shlex.split(args.kvfleet_args),
                                                    args.compare_backend), args.kvfleet_timeout)
                res["greedy_vs_backend"] = dict(greedy_compare(kv, other),
                                                backend=args.compare_backend)
        except Exception as e:  # one broken variant must not hide the others
            res["kvfleet_error"] = "%s: %s" % (type(e).__name__, e)
    res["gating"] = v["dtype"] == "float32"
    res["pass"] = (res["reference_vs_hf"]["ratio"] < TOLERANCE
                   and "kvfleet_vs_hf" in res and res["kvfleet_vs_hf"]["ratio"] < TOLERANCE
                   and (not args.compare_backend
                        or res.get("greedy_vs_backend", {"clear": 1})["clear"] == 0))
    res["seconds"] = round(time.time() - start, 2)
    return res


def fmt(res, key, field="ratio"):
    if key not in res:
        return "-"
    value = res[key][field]
    return "%.2e" % value if field == "ratio" else "%.3f" % value


def print_table(results):
    head = "%-28s %-9s %-10s %-7s %-10s %-10s %-7s %s"
    print(head % ("variant", "dtype", "kv/hf", "argmax", "ref/hf", "ref/hf64", "secs", "status"))
    for r in results:
        if "error" in r:
            status = "ERROR " + r["error"].strip().splitlines()[-1][:80]
        elif "kvfleet_error" in r:
            status = "KVFLEET ERROR " + r["kvfleet_error"][:80]
        elif not r["gating"]:
            status = "report only"
        else:
            status = "PASS" if r["pass"] else "FAIL"
        print(head % (r["name"], r.get("dtype", "?"), fmt(r, "kvfleet_vs_hf"),
                      fmt(r, "kvfleet_vs_hf", "argmax_agree"), fmt(r, "reference_vs_hf"),
                      fmt(r, "reference_vs_hf_fp64"), r.get("seconds", "-"), status))
    print("ratio = max|logits - transformers| / max|transformers logits|; fp32 goal < %g" % TOLERANCE)
    for r in results:
        g = r.get("greedy_vs_backend")
        if g:
            print("%s: greedy vs --backend %s: %d/%d agree, %d near-ties, %d clear misses"
                  % (r["name"], g["backend"], g["agree"], g["positions"], g["near_tie"], g["clear"]))
    bf16 = [r for r in results if r.get("dtype") == "bfloat16" and "kvfleet_vs_reference" in r]
    for r in bf16:
        print("%s: kvfleet vs float64 reference on the same bf16 weights: ratio %s, argmax %s"
              % (r["name"], fmt(r, "kvfleet_vs_reference"),
                 fmt(r, "kvfleet_vs_reference", "argmax_agree")))


def parse_args(argv):
    p = argparse.ArgumentParser(description="kvfleet vs transformers logit parity")
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="kvfleet bin dir")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "parity"))
    p.add_argument("--only", action="append", help="run only variants whose name contains this")
    p.add_argument("--hf-device", default="cpu", help="device for transformers (cpu: no TF32)")
    p.add_argument("--kvfleet-args", default="", help="extra arguments for `kvfleet logits`")
    p.add_argument("--compare-backend", default=None,
                   help="also run kvfleet with --backend B and compare greedy choices (e.g. cpu)")
    p.add_argument("--kvfleet-timeout", type=float, default=60.0, help="seconds per invocation")
    p.add_argument("--keep-models", action="store_true", help="write models under OUT/models")
    return p.parse_args(argv)


def summarize(env, results, kvfleet_exe, complete):
    """The parity.json document and the exit code (see the module docstring)."""
    gating = [r for r in results if r["gating"]]
    ok = complete and bool(results) and bool(kvfleet_exe) and all(r["pass"] for r in gating)
    ref_ok = all("reference_vs_hf" in r and r["reference_vs_hf"]["ratio"] < TOLERANCE
                 for r in gating)
    code = 0 if ok else (2 if complete and results and not kvfleet_exe and ref_ok else 1)
    return {"env": env, "tolerance": TOLERANCE, "complete": complete, "ok": ok,
            "exit_code": code, "variants": results}, code


def environment(args, kvfleet_exe):
    import torch
    import transformers
    try:  # fp32 truth must be real fp32 (only matters with --hf-device cuda)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    except (AttributeError, RuntimeError) as e:
        print("note: could not pin fp32 matmul precision: %s" % e)
    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "cuda": torch.cuda.is_available(), "hf_device": args.hf_device,
           "kvfleet": kvfleet_exe, "kvfleet_args": args.kvfleet_args}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def main(argv=None):
    import traceback
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    report_path = os.path.join(args.out, "parity.json")
    work_dir = os.path.join(args.out, "models") if args.keep_models else tempfile.mkdtemp()
    os.makedirs(work_dir, exist_ok=True)
    exe = os.path.join(args.bin, "kvfleet")
    kvfleet_exe = exe if os.access(exe, os.X_OK) else None
    env = environment(args, kvfleet_exe)
    print(json.dumps(env))
    if not kvfleet_exe:
        print("WARNING: %s not found or not executable; only the reference is checked" % exe)
    selected = [v for v in variant_list()
                if not args.only or any(s in v["name"] for s in args.only)]
    if not selected:
        print("no variant matches --only %s" % args.only)
    results = []
    for v in selected:
        try:
            results.append(run_variant(v, args, work_dir, kvfleet_exe))
        except Exception:
            results.append({"name": v["name"], "dtype": v["dtype"], "gating": True,
                            "pass": False, "error": traceback.format_exc()})
            print(results[-1]["error"], file=sys.stderr)
        print("%s done (%s s)" % (v["name"], results[-1].get("seconds", "?")), flush=True)
        # rewritten after every variant so that a run cut short still leaves its results
        doc, code = summarize(env, results, kvfleet_exe, len(results) == len(selected))
        with open(report_path, "w") as f:
            json.dump(doc, f, indent=1)
    doc, code = summarize(env, results, kvfleet_exe, True)
    with open(report_path, "w") as f:
        json.dump(doc, f, indent=1)
    if not args.keep_models:
        shutil.rmtree(work_dir, ignore_errors=True)
    print_table(results)
    print("wrote %s; exit %d" % (report_path, code))
    return code


if __name__ == "__main__":
    sys.exit(main())
