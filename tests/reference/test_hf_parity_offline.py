#!/usr/bin/python3
"""Runs bench/device/hf_parity.py end to end without torch: fake_hf/ stands in for torch,
transformers and the kvfleet binary (all computing through llama_ref), so this checks the
script's plumbing and exit codes, not the maths. Run: /usr/bin/python3 <this file>."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FAKE = os.path.join(HERE, "fake_hf")
TMP = tempfile.mkdtemp(prefix="hf_parity_offline_")


def fake_bin():
    path = os.path.join(TMP, "bin")
    os.makedirs(path, exist_ok=True)
    exe = os.path.join(path, "kvfleet")
    with open(exe, "w") as f:
        f.write('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable,
                                                      os.path.join(FAKE, "fake_kvfleet.py")))
    os.chmod(exe, 0o755)
    return path


def run_parity(name, *args, bin_dir=None):
    out = os.path.join(TMP, name)
    env = dict(os.environ, PYTHONPATH=FAKE)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "device", "hf_parity.py"),
                           "--bin", bin_dir or fake_bin(), "--out", out] + list(args),
                          capture_output=True, text=True, env=env)
    with open(os.path.join(out, "parity.json")) as f:
        return proc.returncode, json.load(f), proc.stdout


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def test_matching_kvfleet_passes():
    code, doc, stdout = run_parity("pass", "--only", "mha", "--only", "linear")
    names = [v["name"] for v in doc["variants"]]
    check(code == 0 and doc["ok"], "exit %d, ok %s" % (code, doc["ok"]))
    check(names == ["llama_mha_tied_f32", "llama_linear_rope_bias_f32"], "variants %s" % names)
    for v in doc["variants"]:
        # the fake transformers hands back float32 logits, as the real one does
        check(v["kvfleet_vs_hf"]["ratio"] < 1e-6, "%s kvfleet diff" % v["name"])
        check(v["kvfleet_vs_hf"]["argmax_agree"] == 1.0, "%s argmax" % v["name"])
        check(v["kvfleet_vs_hf"]["positions"] == 1 + 6 + 37, "%s positions" % v["name"])
        check(v["rope_inv_freq_rel_gap"] < 1e-6, "%s rope gap" % v["name"])
    check("PASS" in stdout and "FAIL" not in stdout, "table:\n" + stdout)


def test_off_by_a_little_fails():
    code, doc, stdout = run_parity("perturbed", "--only", "mha", "--kvfleet-args=--perturb=0.01")
    (v,) = doc["variants"]
    check(code == 1 and not doc["ok"] and not v["pass"], "exit %d" % code)
    check(abs(v["kvfleet_vs_hf"]["max_abs_diff"] - 0.01) < 1e-4, "diff %r" % v["kvfleet_vs_hf"])
    check("FAIL" in stdout, "table:\n" + stdout)


def test_bf16_reports_but_does_not_gate():
    code, doc, _ = run_parity("bf16", "--only", "qwen2_qkv_bias_bf16",
                              "--kvfleet-args=--perturb=0.5")
    (v,) = doc["variants"]
    check(code == 0 and not v["gating"], "exit %d, gating %s" % (code, v["gating"]))
    check(abs(v["kvfleet_vs_reference"]["max_abs_diff"] - 0.5) < 1e-6, "bf16 vs reference")


def test_missing_binary_exits_2():
    code, doc, _ = run_parity("nobin", "--only", "mha", bin_dir=os.path.join(TMP, "none"))
    (v,) = doc["variants"]
    check(code == 2 and "kvfleet_vs_hf" not in v, "exit %d" % code)
    check(v["reference_vs_hf"]["ratio"] < 1e-6, "reference still compared")


def test_no_matching_variant_fails():
    code, doc, _ = run_parity("nomatch", "--only", "no_such_variant")
    check(code == 1 and doc["variants"] == [] and not doc["ok"], "exit %d" % code)


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print("PASS %s" % name)
        except Exception as e:  # report all, then exit non-zero
            failed += 1
            print("FAIL %s: %s: %s" % (name, type(e).__name__, e))
    print("%d passed, %d failed" % (len(tests) - failed, failed))
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
