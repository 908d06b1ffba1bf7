#!/usr/bin/python3
"""Self-test for moe_ref.py. Run: /usr/bin/python3 tests/reference/test_moe_ref.py
Exits non-zero when any check fails. Needs numpy only. MoE models are built here from tiny_model.py's
dense writer, so that the reference is checked against hand values and against llama_ref.py's dense
models (an MoE whose experts are all one MLP is that dense model)."""

import copy
import math
import os
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import llama_ref  # noqa: E402
import moe_ref  # noqa: E402
from tiny_model import base_config, random_weights, write_model  # noqa: E402

TMP = tempfile.mkdtemp(prefix="moe_ref_test_")
_counter = [0]
IDS = [3, 17, 5, 29, 11, 2, 38, 7, 21, 13]


def model_dir(config, weights, dtype="F32"):
    _counter[0] += 1
    path = os.path.join(TMP, "m%d" % _counter[0])
    write_model(path, config, weights, dtype)
    return path


def assert_close(actual, expected, tol, what):
    err = float(np.max(np.abs(np.asarray(actual) - np.asarray(expected))))
    if not err <= tol:
        raise AssertionError("%s: max abs diff %.3g > %.3g" % (what, err, tol))


def assert_differs(a, b, min_diff, what):
    diff = float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    if not diff > min_diff:
        raise AssertionError("%s: expected a difference, got %.3g" % (what, diff))


def moe_from_dense(dense, config, experts, rng, block, names, same_experts=True, packed=False):
    """Replaces every layer's mlp.* of a dense weight dict with a sparse block whose experts all equal
    the dense MLP (same_experts) or are random."""
    w = {k: v for k, v in dense.items() if ".mlp." not in k}
    hidden = config["hidden_size"]
    for i in range(config["num_hidden_layers"]):
        p = "model.layers.%d." % i
        mlp = [dense[p + "mlp.%s.weight" % n] for n in ("gate_proj", "up_proj", "down_proj")]
        b = p + block
        w[b + "gate.weight"] = rng.standard_normal((experts, hidden))
        parts = []
        for e in range(experts):
            g, u, d = mlp if same_experts else [rng.standard_normal(m.shape) / np.sqrt(m.shape[1]) for m in mlp]
            parts.append((g, u, d))
            if not packed:
                for name, m in zip(names, (g, u, d)):
                    w["%sexperts.%d.%s.weight" % (b, e, name)] = m
        if packed:
            w[b + "experts.gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u, _ in parts])
            w[b + "experts.down_proj"] = np.stack([d for _, _, d in parts])
    return w


MIXTRAL_NAMES = ("w1", "w3", "w2")
QWEN_NAMES = ("gate_proj", "up_proj", "down_proj")


def test_route_by_hand():
    # logits 0, ln 2, ln 3 -> probs 1/6, 2/6, 3/6; top-2 = experts 2, 1.
    x = np.array([[1.0]])
    router = np.array([[0.0], [math.log(2)], [math.log(3)]])
    top, ids = moe_ref.route(x, router, 2, False)
    assert list(ids[0]) == [2, 1], ids
    assert_close(top, [[0.5, 1 / 3]], 1e-15, "top-2 probabilities")
    top, _ = moe_ref.route(x, router, 2, True)
    assert_close(top, [[0.6, 0.4]], 1e-15, "renormalised")
    # equal probabilities: the lower expert id first (torch.topk on CPU does the same for ties here)
    _, ids = moe_ref.route(x, np.zeros((4, 1)), 2, False)
    assert list(ids[0]) == [0, 1], ids


def test_layer_choice():
    spec = {"mlp_only": [], "experts": 4, "sparse_step": 2}
    assert [moe_ref.is_sparse_layer(spec, i) for i in range(4)] == [False, True, False, True]
    spec = {"mlp_only": [1], "experts": 4, "sparse_step": 1}
    assert [moe_ref.is_sparse_layer(spec, i) for i in range(3)] == [True, False, True]


def test_mixtral_of_identical_experts_is_mistral():
    rng = np.random.default_rng(1)
    cfg = base_config(model_type="mistral")
    dense = random_weights(cfg, seed=5)
    (want,) = llama_ref.run(model_dir(cfg, dense), [IDS])
    mcfg = dict(cfg, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    for block, packed in (("block_sparse_moe.", False), ("mlp.", True)):
        w = moe_from_dense(dense, cfg, 4, rng, block, MIXTRAL_NAMES, packed=packed)
        (got,) = moe_ref.run(model_dir(mcfg, w), [IDS])
        assert_close(got, want, 1e-10, "mixtral of identical experts (%s)" % block)


def test_layouts_agree_and_experts_matter():
    rng = np.random.default_rng(2)
    cfg = base_config(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                      moe_intermediate_size=24, head_dim=4)
    dense = random_weights(cfg, seed=6)
    for i in range(cfg["num_hidden_layers"]):
        dense["model.layers.%d.self_attn.q_norm.weight" % i] = 1 + 0.1 * rng.standard_normal(4)
        dense["model.layers.%d.self_attn.k_norm.weight" % i] = 1 + 0.1 * rng.standard_normal(4)
    per = moe_from_dense(dense, cfg, 4, np.random.default_rng(9), "mlp.", QWEN_NAMES, same_experts=False)
    packed = copy.deepcopy({k: v for k, v in per.items() if ".experts." not in k})
    for i in range(cfg["num_hidden_layers"]):
        b = "model.layers.%d.mlp." % i
        g = [per[b + "experts.%d.gate_proj.weight" % e] for e in range(4)]
        u = [per[b + "experts.%d.up_proj.weight" % e] for e in range(4)]
        d = [per[b + "experts.%d.down_proj.weight" % e] for e in range(4)]
        packed[b + "experts.gate_up_proj"] = np.stack([np.concatenate([a, c]) for a, c in zip(g, u)])
        packed[b + "experts.down_proj"] = np.stack(d)
    (a,) = moe_ref.run(model_dir(cfg, per), [IDS])
    (b,) = moe_ref.run(model_dir(cfg, packed), [IDS])
    assert_close(a, b, 1e-12, "packed == per-expert")
    (c,) = moe_ref.run(model_dir(dict(cfg, norm_topk_prob=False), per), [IDS])
    assert_differs(a, c, 1e-3, "norm_topk_prob changes the output")
    (d,) = moe_ref.run(model_dir(dict(cfg, num_experts_per_tok=1), per), [IDS])
    assert_differs(a, d, 1e-3, "top-1 differs from top-2")


def test_qwen3_qk_norm_is_applied():
    rng = np.random.default_rng(3)
    cfg = base_config(model_type="qwen3_moe", num_experts=2, num_experts_per_tok=1, moe_intermediate_size=24,
                      head_dim=4, rms_norm_eps=0.0)
    dense = random_weights(cfg, seed=7)
    for i in range(2):
        dense["model.layers.%d.self_attn.q_norm.weight" % i] = 1 + 0.1 * rng.standard_normal(4)
        dense["model.layers.%d.self_attn.k_norm.weight" % i] = 1 + 0.1 * rng.standard_normal(4)
    w = moe_from_dense(dense, cfg, 2, rng, "mlp.", QWEN_NAMES)
    (base,) = moe_ref.run(model_dir(cfg, w, "F64"), [IDS])  # F64: 3 * w exact
    scaled = dict(w)
    for i in range(2):
        for n in ("q_proj", "k_proj"):
            scaled["model.layers.%d.self_attn.%s.weight" % (i, n)] = 3.0 * w["model.layers.%d.self_attn.%s.weight" % (i, n)]
    (got,) = moe_ref.run(model_dir(cfg, scaled, "F64"), [IDS])
    assert_close(got, base, 1e-9, "q/k scale is normalised away per head")
    changed = dict(w)
    changed["model.layers.0.self_attn.q_norm.weight"] = w["model.layers.0.self_attn.q_norm.weight"] * 2
    (got,) = moe_ref.run(model_dir(cfg, changed), [IDS])
    assert_differs(got, base, 1e-4, "q_norm weight matters")


def test_qwen2_moe_shared_expert_gate():
    # Experts with zero down projections and a zero shared_expert_gate: the block is 0.5 * shared(x),
    # i.e. a dense qwen2 model whose MLP down projection is halved.
    rng = np.random.default_rng(4)
    cfg = base_config(model_type="qwen2")
    dense = random_weights(cfg, seed=8, with_biases={"qkv"})
    half = dict(dense)
    for i in range(2):
        half["model.layers.%d.mlp.down_proj.weight" % i] = 0.5 * dense["model.layers.%d.mlp.down_proj.weight" % i]
    (want,) = llama_ref.run(model_dir(cfg, half), [IDS])
    mcfg = dict(cfg, model_type="qwen2_moe", num_experts=3, num_experts_per_tok=2, moe_intermediate_size=8,
                shared_expert_intermediate_size=cfg["intermediate_size"])
    w = {k: v for k, v in dense.items() if ".mlp." not in k}
    for i in range(2):
        p, b = "model.layers.%d.mlp." % i, "model.layers.%d.mlp." % i
        w[b + "gate.weight"] = rng.standard_normal((3, cfg["hidden_size"]))
        for e in range(3):
            w[b + "experts.%d.gate_proj.weight" % e] = rng.standard_normal((8, cfg["hidden_size"]))
            w[b + "experts.%d.up_proj.weight" % e] = rng.standard_normal((8, cfg["hidden_size"]))
            w[b + "experts.%d.down_proj.weight" % e] = np.zeros((cfg["hidden_size"], 8))
        for n in ("gate_proj", "up_proj", "down_proj"):
            w[b + "shared_expert.%s.weight" % n] = dense[p + "%s.weight" % n]
        w[b + "shared_expert_gate.weight"] = np.zeros((1, cfg["hidden_size"]))
    (got,) = moe_ref.run(model_dir(mcfg, w), [IDS])
    assert_close(got, want, 1e-10, "sigmoid(0) * shared expert")
    # mlp_only_layers: layer 1 dense again (its mlp.* weights back)
    only = dict(w)
    for n in ("gate_proj", "up_proj", "down_proj"):
        only["model.layers.1.mlp.%s.weight" % n] = half["model.layers.1.mlp.%s.weight" % n]
    (got,) = moe_ref.run(model_dir(dict(mcfg, mlp_only_layers=[1]), only), [IDS])
    assert_close(got, want, 1e-10, "mlp_only_layers reads the dense MLP")


def test_cli_json():
    import json
    import subprocess
    cfg = base_config(model_type="mixtral", num_local_experts=2, num_experts_per_tok=1)
    dense = random_weights(cfg, seed=9)
    path = model_dir(cfg, moe_from_dense(dense, cfg, 2, np.random.default_rng(0), "mlp.", MIXTRAL_NAMES))
    out = subprocess.run([sys.executable, os.path.join(HERE, "moe_ref.py"), "--model", path, "--ids", "1,2",
                          "--ids", "3"], check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    assert [len(x) for x in doc["logits"]] == [2, 1] and len(doc["logits"][0][0]) == cfg["vocab_size"]


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_") and callable(v)]
    failed = 0
    for t in tests:
        try:
            t()
            print("ok   %s" % t.__name__)
        except Exception:  # noqa: BLE001
            failed += 1
            print("FAIL %s" % t.__name__)
            traceback.print_exc()
    print("%d passed, %d failed" % (len(tests) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
