#!/usr/bin/python3
"""Independent float64 reference for mixture-of-experts causal-LM logits (numpy only): Mixtral,
Qwen2-MoE and Qwen3-MoE.

Usage:
    /usr/bin/python3 tests/reference/moe_ref.py --model DIR --ids 1,2,3 [--ids 4,5 ...]
prints {"logits": [[[vocab floats] per position] per --ids sequence]}, like llama_ref.py.

Written from transformers' modeling_mixtral.py, modeling_qwen2_moe.py and modeling_qwen3_moe.py,
sharing no code with the kvfleet engine. From llama_ref.py it reuses only the safetensors reader and
the RoPE helpers (themselves written from transformers). What it models:
  - the router: logits = x @ gate.T, softmax in float, top-k, divided by the top-k sum when
    norm_topk_prob (MixtralSparseMoeBlock always), then each token's experts summed with those weights;
  - experts in either checkpoint layout: experts.N.{w1,w3,w2} (Mixtral) / experts.N.{gate,up,down}_proj
    (Qwen), or transformers 5's packed experts.gate_up_proj [E, 2I, H] (gate = first I rows) and
    experts.down_proj [E, H, I]; the Mixtral block is `block_sparse_moe` before transformers 5, `mlp` after;
  - Qwen2-MoE's shared expert: + sigmoid(shared_expert_gate(x)) * shared_expert(x);
  - Qwen2/3-MoE's layer choice: sparse when layer not in mlp_only_layers and
    (layer + 1) % decoder_sparse_step == 0, else the dense MLP of intermediate_size;
  - attention: Mixtral = Mistral (no biases), Qwen2-MoE q/k/v bias (config qkv_bias, default true),
    Qwen3-MoE attention_bias on q/k/v/o plus RMSNorm over head_dim on every q and k head before RoPE.
Sliding windows are not modelled (the tests' sequences are shorter than any window).
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402  (safetensors reader and RoPE only)

SUPPORTED_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


def load_config(model_dir):
    """Normalised config with the defaults of MixtralConfig / Qwen2MoeConfig / Qwen3MoeConfig."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    t = cfg.get("model_type")
    if t not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError("model_type %r" % t)
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError("hidden_act %r" % cfg.get("hidden_act"))
    heads = cfg["num_attention_heads"]
    theta, scaling = llama_ref._rope_settings(cfg)
    rope_type = "default"
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    spec = {
        "model_type": t,
        "hidden": cfg["hidden_size"],
        "intermediate": cfg["intermediate_size"],
        "layers": cfg["num_hidden_layers"],
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "vocab": cfg["vocab_size"],
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "rope_theta": theta,
        "rope_type": rope_type,
        "rope_scaling": dict(scaling) if scaling else {},
    }
    if t == "mixtral":
        spec.update(experts=cfg.get("num_local_experts", 8), top_k=cfg.get("num_experts_per_tok", 2),
                    norm_topk=True, sparse_step=1, mlp_only=[], shared=0,
                    qkv_bias=False, o_bias=False, qk_norm=False)
    else:
        q2 = t == "qwen2_moe"
        spec.update(experts=cfg.get("num_experts", 60 if q2 else 128),
                    top_k=cfg.get("num_experts_per_tok", 4 if q2 else 8),
                    norm_topk=bool(cfg.get("norm_topk_prob", False)),
                    sparse_step=cfg.get("decoder_sparse_step", 1),
                    mlp_only=list(cfg.get("mlp_only_layers") or []),
                    shared=cfg.get("shared_expert_intermediate_size", 5632) if q2 else 0)
        if q2:
            spec.update(qkv_bias=bool(cfg.get("qkv_bias", True)), o_bias=False, qk_norm=False)
        else:
            bias = bool(cfg.get("attention_bias", False))
            spec.update(qkv_bias=bias, o_bias=bias, qk_norm=True)
    return spec


def is_sparse_layer(spec, i):
    """Qwen2MoeDecoderLayer.__init__ (Mixtral: every layer)."""
    return i not in spec["mlp_only"] and spec["experts"] > 0 and (i + 1) % spec["sparse_step"] == 0


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """RMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) * weight."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


def proj(x, weights, name, bias):
    y = x @ weights[name + ".weight"].T
    return y + weights[name + ".bias"] if bias else y


def attention(spec, weights, p, x, cos, sin):
    """MixtralAttention / Qwen2MoeAttention / Qwen3MoeAttention, eager, causal."""
    t, nh, nkv, hd = x.shape[0], spec["heads"], spec["kv_heads"], spec["head_dim"]
    q = proj(x, weights, p + "q_proj", spec["qkv_bias"]).reshape(t, nh, hd)
    k = proj(x, weights, p + "k_proj", spec["qkv_bias"]).reshape(t, nkv, hd)
    v = proj(x, weights, p + "v_proj", spec["qkv_bias"]).reshape(t, nkv, hd)
    if spec["qk_norm"]:
        # Qwen3Attention: q_norm / k_norm on view(..., head_dim), before the transpose and RoPE
        q = rms_norm(q, weights[p + "q_norm.weight"], spec["eps"])
        k = rms_norm(k, weights[p + "k_norm.weight"], spec["eps"])
    q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
    q, k = llama_ref.apply_rope(q, cos, sin), llama_ref.apply_rope(k, cos, sin)
    k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
    scores = (q @ k.transpose(0, 2, 1)) * hd ** -0.5
    scores = np.where(np.triu(np.ones((t, t), dtype=bool), k=1)[None], -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(t, nh * hd)
    return proj(out, weights, p + "o_proj", spec["o_bias"])


def swiglu(x, gate, up, down):
    """MixtralBlockSparseTop2MLP / Qwen2MoeMLP: down(silu(gate x) * up x)."""
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


def route(x, router, top_k, norm_topk):
    """Softmax over the router logits, top-k, optional renormalisation -> (weights [T,k], ids [T,k])."""
    logits = x @ router.T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    top = np.take_along_axis(probs, ids, axis=-1)
    if norm_topk:
        top = top / top.sum(axis=-1, keepdims=True)
    return top, ids


def block_prefix(weights, layer_prefix):
    for name in ("block_sparse_moe.", "mlp."):
        if layer_prefix + name + "gate.weight" in weights:
            return layer_prefix + name
    raise KeyError("no MoE router (gate.weight) under %s" % layer_prefix)


def expert(spec, weights, b, e):
    """(gate [I,H], up [I,H], down [H,I]) of expert e, from either layout."""
    if b + "experts.gate_up_proj" in weights:
        gate_up = weights[b + "experts.gate_up_proj"][e]     # .chunk(2, dim=-1) of x @ gate_up.T
        half = gate_up.shape[0] // 2
        return gate_up[:half], gate_up[half:], weights[b + "experts.down_proj"][e]
    names = ("w1", "w3", "w2") if spec["model_type"] == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    return tuple(weights["%sexperts.%d.%s.weight" % (b, e, n)] for n in names)


def sparse_block(spec, weights, layer_prefix, x):
    """MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock."""
    b = block_prefix(weights, layer_prefix)
    top, ids = route(x, weights[b + "gate.weight"], spec["top_k"], spec["norm_topk"])
    out = np.zeros_like(x)
    for e in range(spec["experts"]):
        token, slot = np.nonzero(ids == e)
        if token.size:
            out[token] += swiglu(x[token], *expert(spec, weights, b, e)) * top[token, slot][:, None]
    if spec["shared"]:
        s = b + "shared_expert."
        shared = swiglu(x, weights[s + "gate_proj.weight"], weights[s + "up_proj.weight"],
                        weights[s + "down_proj.weight"])
        gate = 1.0 / (1.0 + np.exp(-(x @ weights[b + "shared_expert_gate.weight"].T)))
        out = out + gate * shared
    return out


def forward(spec, weights, ids):
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("ids must be a non-empty list")
    if ids.min() < 0 or ids.max() >= spec["vocab"]:
        raise ValueError("token id out of range [0, %d)" % spec["vocab"])
    cos, sin = llama_ref.rope_cos_sin(llama_ref.rope_inv_freq(spec), np.arange(ids.size))
    x = weights["model.embed_tokens.weight"][ids]
    for i in range(spec["layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, weights[p + "input_layernorm.weight"], spec["eps"])
        x = x + attention(spec, weights, p + "self_attn.", h, cos, sin)
        h = rms_norm(x, weights[p + "post_attention_layernorm.weight"], spec["eps"])
        if is_sparse_layer(spec, i):
            x = x + sparse_block(spec, weights, p, h)
        else:
            m = p + "mlp."
            x = x + swiglu(h, weights[m + "gate_proj.weight"], weights[m + "up_proj.weight"],
                           weights[m + "down_proj.weight"])
    x = rms_norm(x, weights["model.norm.weight"], spec["eps"])
    head = weights["model.embed_tokens.weight"] if spec["tied"] else weights["lm_head.weight"]
    return x @ head.T


def run(model_dir, id_lists):
    spec = load_config(model_dir)
    weights = llama_ref.load_weights(model_dir)
    return [forward(spec, weights, ids) for ids in id_lists]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--ids", action="append", required=True,
                        help="comma-separated token ids; repeat for more sequences")
    args = parser.parse_args(argv)
    logits = run(args.model, [llama_ref.parse_ids(s) for s in args.ids])
    json.dump({"logits": [l.tolist() for l in logits]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
