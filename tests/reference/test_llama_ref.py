#!/usr/bin/python3
"""Self-test for llama_ref.py. Run: /usr/bin/python3 tests/reference/test_llama_ref.py
Exits non-zero when any check fails. Needs numpy only."""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import llama_ref  # noqa: E402
from tiny_model import base_config, bf16_round, random_weights, write_model  # noqa: E402

TMP = tempfile.mkdtemp(prefix="llama_ref_test_")
_counter = [0]


def model_dir(config, weights, dtype="F32", shards=1):
    _counter[0] += 1
    path = os.path.join(TMP, "m%d" % _counter[0])
    write_model(path, config, weights, dtype, shards)
    return path


def logits_of(path, *id_lists):
    return llama_ref.run(path, list(id_lists))


def assert_close(actual, expected, tol, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        raise AssertionError("%s: shape %s != %s" % (what, actual.shape, expected.shape))
    err = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    if not err <= tol:
        raise AssertionError("%s: max abs diff %.3g > %.3g" % (what, err, tol))


def assert_differs(a, b, min_diff, what):
    diff = float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    if not diff > min_diff:
        raise AssertionError("%s: expected a difference, got max abs diff %.3g" % (what, diff))


def expect_raises(exc_type, fn, what):
    try:
        fn()
    except exc_type:
        return
    raise AssertionError("%s: %s not raised" % (what, exc_type.__name__))


# ---------------------------------------------------------------------------------------------
# Hand-computed model: hidden 2, two query heads of head_dim 2 sharing one kv head.
# ---------------------------------------------------------------------------------------------

HAND_CONFIG = base_config(hidden_size=2, intermediate_size=1, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=2,
                          rms_norm_eps=0.0, vocab_size=2)
HAND_WEIGHTS = {
    "model.embed_tokens.weight": np.array([[1.0, 1.0], [1.0, -1.0]]),
    "model.layers.0.input_layernorm.weight": np.array([1.0, 1.0]),
    # head 0 queries with the identity, head 1 has a zero query (uniform attention)
    "model.layers.0.self_attn.q_proj.weight": np.array([[1.0, 0], [0, 1], [0, 0], [0, 0]]),
    "model.layers.0.self_attn.k_proj.weight": np.eye(2),
    "model.layers.0.self_attn.v_proj.weight": np.array([[0.0, 0], [3, 3]]),
    # o = [head0[0], head0[1] + head1[1]]
    "model.layers.0.self_attn.o_proj.weight": np.array([[1.0, 0, 0, 0], [0, 1, 0, 1]]),
    "model.layers.0.post_attention_layernorm.weight": np.array([1.0, 1.0]),
    "model.layers.0.mlp.gate_proj.weight": np.array([[0.0, 1.0]]),
    "model.layers.0.mlp.up_proj.weight": np.array([[5.0, 0.0]]),
    "model.layers.0.mlp.down_proj.weight": np.array([[1.0], [0.0]]),
    "model.norm.weight": np.array([1.0, 2.0]),
    "lm_head.weight": np.array([[1.0, 0.0], [1.0, 1.0]]),
}


def hand_tail(h):
    """Post-attention half of the hand model for residual h = [h0, h1], done by hand."""
    r = math.sqrt((h[0] ** 2 + h[1] ** 2) / 2)           # post_attention_layernorm (w = 1)
    n = [h[0] / r, h[1] / r]
    g = n[1]                                              # gate = [0, 1] . n
    mlp0 = g / (1 + math.exp(-g)) * (5 * n[0])            # silu(gate) * up, down = [[1], [0]]
    h = [h[0] + mlp0, h[1]]
    r = math.sqrt((h[0] ** 2 + h[1] ** 2) / 2)           # final norm, weight [1, 2]
    z = [h[0] / r, 2 * h[1] / r]
    return [z[0], z[0] + z[1]]                            # lm_head [[1, 0], [1, 1]]


def test_hand_computed():
    path = model_dir(HAND_CONFIG, HAND_WEIGHTS)
    # Token 0 at position 0: normed [1, 1], v = [0, 6]; one key, so both heads return v.
    # o = [0, 6 + 6]; residual h = [1, 13].
    row0 = hand_tail([1.0, 13.0])
    # Token 1 at position 1: normed [1, -1], v1 = 0. head_dim 2 => inv_freq = [1], angle 1.
    # head 0: q = R(1)[1, -1], k0 = [1, 1], k1 = R(1)[1, -1]; q.k0 = 2 sin 1, q.k1 = 2;
    # scores scaled by 1/sqrt(head_dim = 2).
    s0, s1 = 2 * math.sin(1.0) / math.sqrt(2), 2 / math.sqrt(2)
    p0 = math.exp(s0) / (math.exp(s0) + math.exp(s1))
    # head 0 -> [0, 6 p0]; head 1 (zero query) averages -> [0, 3]; o = [0, 6 p0 + 3].
    row1 = hand_tail([1.0, -1.0 + 6 * p0 + 3])
    (got,) = logits_of(path, [0, 1])
    assert_close(got, [row0, row1], 1e-12, "hand-computed logits")


def test_rope_layout_is_rotate_half():
    # head_dim 4, theta 100: inv_freq = [1, 0.1]; pairs are (0, 2) and (1, 3), not (0, 1).
    spec = {"head_dim": 4, "rope_theta": 100.0, "rope_type": "default", "rope_scaling": {}}
    inv = llama_ref.rope_inv_freq(spec)
    assert_close(inv, [1.0, 0.1], 1e-15, "default inv_freq")
    x = np.array([1.0, 2.0, 3.0, 4.0])
    cos, sin = llama_ref.rope_cos_sin(inv, [3])
    got = llama_ref.apply_rope(x[None, None, :], cos, sin)[0, 0]
    a, b = 3 * 1.0, 3 * 0.1
    want = [1 * math.cos(a) - 3 * math.sin(a), 2 * math.cos(b) - 4 * math.sin(b),
            3 * math.cos(a) + 1 * math.sin(a), 4 * math.cos(b) + 2 * math.sin(b)]
    assert_close(got, want, 1e-14, "rope at position 3")
    cos0, sin0 = llama_ref.rope_cos_sin(inv, [0])
    got0 = llama_ref.apply_rope(x[None, None, :], cos0, sin0)[0, 0]
    assert_close(got0, x, 0.0, "rope at position 0 is the identity")


def test_llama3_inv_freq_by_hand():
    # head_dim 8, theta 10000: inv_freq = [1, 0.1, 0.01, 0.001], wavelen = 2 pi / inv_freq.
    # original 1024, low 1, high 4: low_freq_wavelen 1024, high_freq_wavelen 256.
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1024}
    spec = {"head_dim": 8, "rope_theta": 10000.0, "rope_type": "llama3", "rope_scaling": sc}
    got = llama_ref.rope_inv_freq(spec)
    smooth = (1024 / (2 * math.pi / 0.01) - 1) / (4 - 1)  # 628 is between 256 and 1024
    want = [1.0, 0.1,                                      # 6.3, 63 < 256: unchanged
            (1 - smooth) * 0.01 / 8 + smooth * 0.01,       # medium: interpolated
            0.001 / 8]                                     # 6283 > 1024: divided by factor
    assert_close(got, want, 1e-15, "llama3 inv_freq")
    # factor 1 changes nothing; a huge original context leaves every frequency high.
    default = llama_ref.rope_inv_freq(dict(spec, rope_type="default"))
    for override in ({"factor": 1.0}, {"original_max_position_embeddings": 10 ** 12}):
        s = dict(spec, rope_scaling=dict(sc, **override))
        assert_close(llama_ref.rope_inv_freq(s), default, 1e-15, "llama3 no-op %s" % override)
    lin = dict(spec, rope_type="linear", rope_scaling={"type": "linear", "factor": 4.0})
    assert_close(llama_ref.rope_inv_freq(lin), default / 4, 1e-15, "linear inv_freq")


def test_causality_prefix():
    cfg = base_config()
    path = model_dir(cfg, random_weights(cfg, 1))
    short, long_ = logits_of(path, [3, 1, 4, 1, 5], [3, 1, 4, 1, 5, 9, 2, 6])
    assert_close(long_[:5], short, 1e-12, "prefix rows equal")
    assert_differs(long_[5], long_[4], 1e-3, "later positions differ")


def test_sharded_equals_single():
    cfg = base_config(model_type="qwen2")
    w = random_weights(cfg, 2, with_biases={"qkv"})
    one = logits_of(model_dir(cfg, w), [1, 2, 3, 4])[0]
    three = logits_of(model_dir(cfg, w, shards=3), [1, 2, 3, 4])[0]
    assert_close(three, one, 0.0, "sharded == single file")


def test_half_precision_files():
    cfg = base_config()
    w = {k: bf16_round(v) for k, v in random_weights(cfg, 3).items()}
    ref = logits_of(model_dir(cfg, w), [5, 6, 7])[0]
    bf16_dir = model_dir(cfg, w, dtype="BF16")
    assert_close(llama_ref.load_weights(bf16_dir)["lm_head.weight"], w["lm_head.weight"], 0.0,
                 "bf16 decode")
    assert_close(logits_of(bf16_dir, [5, 6, 7])[0], ref, 0.0, "bf16 file == f32 file")
    w16 = {k: v.astype(np.float16).astype(np.float64) for k, v in w.items()}
    f16_dir = model_dir(cfg, w16, dtype="F16")
    assert_close(llama_ref.load_weights(f16_dir)["model.norm.weight"], w16["model.norm.weight"],
                 0.0, "f16 decode")


def test_gqa_matches_mha_with_repeated_kv():
    cfg = base_config(num_attention_heads=4, num_key_value_heads=2)
    w = random_weights(cfg, 4)
    mha_cfg = dict(cfg, num_key_value_heads=4)
    mha_w = dict(w)
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    for i in range(cfg["num_hidden_layers"]):
        for proj in ("k_proj", "v_proj"):
            name = "model.layers.%d.self_attn.%s.weight" % (i, proj)
            per_head = w[name].reshape(2, hd, -1)
            # query heads 0,1 read kv head 0; heads 2,3 read kv head 1 (repeat_kv)
            mha_w[name] = np.repeat(per_head, 2, axis=0).reshape(4 * hd, -1)
    ids = [7, 3, 9, 1, 0, 2]
    assert_close(logits_of(model_dir(mha_cfg, mha_w), ids)[0],
                 logits_of(model_dir(cfg, w), ids)[0], 1e-12, "GQA == MHA with repeated kv")


def test_head_dim_independent_of_hidden():
    cfg = base_config(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=12)
    path = model_dir(cfg, random_weights(cfg, 5))
    a, b = logits_of(path, [1, 2, 3], [1, 2, 3, 4, 5])
    assert_close(b[:3], a, 1e-12, "head_dim 12 prefix rows")


def test_tied_equals_copied_head():
    tied = base_config(tie_word_embeddings=True)
    w = random_weights(tied, 6)
    untied_w = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"].copy()})
    ids = [4, 4, 8]
    assert_close(logits_of(model_dir(tied, w), ids)[0],
                 logits_of(model_dir(base_config(), untied_w), ids)[0], 0.0, "tied == copied head")
    expect_raises(KeyError, lambda: logits_of(model_dir(base_config(), w), ids),
                  "untied model without lm_head")


def test_qwen2_biases():
    cfg = base_config(model_type="qwen2")
    w = random_weights(cfg, 7, with_biases={"qkv"})
    zero_w = {k: (np.zeros_like(v) if k.endswith(".bias") else v) for k, v in w.items()}
    plain_w = {k: v for k, v in w.items() if not k.endswith(".bias")}
    ids = [1, 5, 2, 8]
    zero_bias = logits_of(model_dir(cfg, zero_w), ids)[0]
    assert_close(zero_bias, logits_of(model_dir(base_config(), plain_w), ids)[0], 1e-12,
                 "qwen2 with zero bias == llama")
    assert_differs(logits_of(model_dir(cfg, w), ids)[0], zero_bias, 1e-3, "qwen2 bias is used")
    expect_raises(KeyError, lambda: logits_of(model_dir(cfg, plain_w), ids),
                  "qwen2 without bias tensors")


def test_o_and_mlp_bias_are_added():
    # With zero v_proj, attention returns exactly o_proj.bias, so residual = embedding + b_o:
    # the same as a bias-free model whose embedding row already includes b_o. Likewise a zero
    # down_proj makes the MLP return its bias.
    cfg = base_config(num_hidden_layers=1, attention_bias=True, mlp_bias=True)
    w = random_weights(cfg, 8, with_biases={"qkv", "o", "mlp"})
    w["model.layers.0.self_attn.v_proj.weight"] *= 0
    w["model.layers.0.self_attn.v_proj.bias"] *= 0
    w["model.layers.0.mlp.down_proj.weight"] *= 0
    plain_cfg = base_config(num_hidden_layers=1)
    plain = {k: v for k, v in w.items() if not k.endswith(".bias")}
    plain["model.embed_tokens.weight"] = (w["model.embed_tokens.weight"]
                                          + w["model.layers.0.self_attn.o_proj.bias"]
                                          + w["model.layers.0.mlp.down_proj.bias"])
    ids = [3, 0, 2]
    # F64 files: the folded embedding must not be rounded differently from the separate terms
    assert_close(logits_of(model_dir(cfg, w, dtype="F64"), ids)[0],
                 logits_of(model_dir(plain_cfg, plain, dtype="F64"), ids)[0], 1e-12,
                 "o_proj and down_proj biases")


def test_rope_config_forms_agree():
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}
    legacy = base_config(rope_theta=500000.0, rope_scaling=sc)
    v5 = base_config(rope_parameters=dict(sc, rope_theta=500000.0))
    del v5["rope_theta"], v5["rope_scaling"]
    plain = base_config(rope_theta=500000.0)
    w = random_weights(legacy, 9)
    ids = list(range(12))
    a = logits_of(model_dir(legacy, w), ids)[0]
    assert_close(logits_of(model_dir(v5, w), ids)[0], a, 0.0, "rope_parameters == rope_scaling")
    assert_differs(logits_of(model_dir(plain, w), ids)[0], a, 1e-6, "llama3 scaling is applied")
    old_type_key = base_config(rope_scaling={"type": "linear", "factor": 2.0})
    new_type_key = base_config(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 10000.0})
    assert_close(logits_of(model_dir(old_type_key, w), ids)[0],
                 logits_of(model_dir(new_type_key, w), ids)[0], 0.0, "linear type/rope_type")


def test_mistral_matches_llama():
    cfg = base_config(model_type="mistral", sliding_window=4096, num_key_value_heads=1)
    w = random_weights(cfg, 10)
    ids = [9, 8, 7]
    assert_close(logits_of(model_dir(cfg, w), ids)[0],
                 logits_of(model_dir(dict(cfg, model_type="llama"), w), ids)[0], 0.0,
                 "mistral == llama architecture")


def test_bad_inputs():
    cfg = base_config()
    path = model_dir(cfg, random_weights(cfg, 11))
    expect_raises(ValueError, lambda: logits_of(path, [0, 40]), "id == vocab_size")
    expect_raises(ValueError, lambda: logits_of(path, []), "empty ids")
    yarn = model_dir(base_config(rope_scaling={"rope_type": "yarn", "factor": 2.0}),
                     random_weights(cfg, 11))
    expect_raises(NotImplementedError, lambda: logits_of(yarn, [1]), "yarn rope")


def test_cli_json():
    cfg = base_config()
    path = model_dir(cfg, random_weights(cfg, 12))
    out = subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), "--model", path,
                          "--ids", "1,2,3", "--ids", "4"], check=True, capture_output=True,
                         text=True).stdout
    got = json.loads(out)["logits"]
    want = logits_of(path, [1, 2, 3], [4])
    if [len(g) for g in got] != [3, 1] or len(got[0][0]) != cfg["vocab_size"]:
        raise AssertionError("CLI JSON has the wrong shape")
    for g, w in zip(got, want):
        assert_close(np.array(g), w, 0.0, "CLI JSON round-trips float64")


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print("PASS %s" % name)
        except Exception:  # report every failure, then exit non-zero
            failed += 1
            print("FAIL %s\n%s" % (name, traceback.format_exc()))
    print("%d passed, %d failed" % (len(tests) - failed, failed))
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
