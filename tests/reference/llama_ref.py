#!/usr/bin/python3
"""Independent float64 reference for Llama / Qwen2 / Mistral causal-LM logits (numpy only).

Usage:
    /usr/bin/python3 tests/reference/llama_ref.py --model DIR --ids 1,2,3 [--ids 4,5 ...]
prints {"logits": [[[vocab floats] per position] per --ids sequence]}; every sequence starts at
position 0. Floats are printed by json (shortest repr that round-trips a float64).

It mirrors Hugging Face transformers' LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM
(modeling_llama.py, modeling_qwen2.py, modeling_mistral.py) without sharing any code with the
kvfleet engine, so that the engine can be checked against it on machines without torch.
Sliding-window attention (Mistral, Qwen2 with use_sliding_window) is not modelled: it changes
nothing while a sequence is shorter than the window, which is all the tests use.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


# ----------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, JSON header, then raw little-endian data.
# ----------------------------------------------------------------------------------------------

def _decode_tensor(raw, dtype, shape):
    if dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F64":
        arr = np.frombuffer(raw, dtype="<f8")
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2")
    elif dtype == "BF16":
        # bfloat16 is the top half of a float32: widen the bits and reinterpret.
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        arr = bits.view(np.float32)
    else:
        raise ValueError("unsupported safetensors dtype %s" % dtype)
    count = int(np.prod(shape)) if shape else 1
    if arr.size != count:
        raise ValueError("tensor byte size does not match shape %s (%s)" % (shape, dtype))
    return arr.astype(np.float64).reshape(shape)


def read_safetensors(path):
    """Returns {name: float64 ndarray} for every tensor in one .safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len].decode("utf-8"))
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = _decode_tensor(data[base + begin:base + end], info["dtype"], info["shape"])
    return tensors


def load_weights(model_dir):
    """Single model.safetensors, or shards listed by model.safetensors.index.json (weight_map)."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            for name, value in read_safetensors(os.path.join(model_dir, shard)).items():
                if weight_map.get(name) == shard:
                    tensors[name] = value
        missing = [n for n in weight_map if n not in tensors]
        if missing:
            raise KeyError("index names tensors missing from their shard: %s" % missing[:5])
        return tensors
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


# ----------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------

def _rope_settings(cfg):
    """(theta, scaling dict or None). transformers 5 writes rope_parameters = {rope_theta,
    rope_type, ...}; older files have top-level rope_theta plus rope_scaling ({"type"|"rope_type",
    ...}). transformers 5 converts the old form into the new one, so the new one wins."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        if any(isinstance(v, dict) for v in params.values()):
            raise NotImplementedError("per-layer-type rope_parameters are not supported")
        theta = params.get("rope_theta", cfg.get("rope_theta"))
        scaling = params
    else:
        theta = cfg.get("rope_theta")
        scaling = cfg.get("rope_scaling")
    theta = 10000.0 if theta is None else float(theta)
    return theta, scaling


def load_config(model_dir):
    """Normalised view of config.json with the defaults transformers applies."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError("model_type %r" % model_type)
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError("hidden_act %r" % cfg.get("hidden_act"))
    heads = cfg["num_attention_heads"]
    theta, scaling = _rope_settings(cfg)
    rope_type = "default"
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if float(scaling.get("partial_rotary_factor", 1.0)) != 1.0:
            raise NotImplementedError("partial_rotary_factor")
    if model_type == "qwen2":
        # Qwen2Attention: q/k/v always biased, o_proj never.
        qkv_bias, o_bias = True, False
    elif model_type == "mistral":
        # MistralAttention: no biases at all.
        qkv_bias = o_bias = False
    else:
        # LlamaAttention: config.attention_bias for all four projections.
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    # Only LlamaMLP reads config.mlp_bias; Qwen2MLP and MistralMLP are bias-free.
    mlp_bias = model_type == "llama" and bool(cfg.get("mlp_bias", False))
    return {
        "model_type": model_type,
        "hidden": cfg["hidden_size"],
        "intermediate": cfg["intermediate_size"],
        "layers": cfg["num_hidden_layers"],
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads") or heads,
        # modeling_llama: getattr(config, "head_dim", None) or hidden_size // num_attention_heads
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "vocab": cfg["vocab_size"],
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "qkv_bias": qkv_bias,
        "o_bias": o_bias,
        "mlp_bias": mlp_bias,
        "rope_theta": theta,
        "rope_type": rope_type,
        "rope_scaling": dict(scaling) if scaling else {},
    }


# ----------------------------------------------------------------------------------------------
# RoPE (modeling_rope_utils.py)
# ----------------------------------------------------------------------------------------------

def rope_inv_freq(spec):
    """Mirrors ROPE_INIT_FUNCTIONS[rope_type](config) for default, linear and llama3."""
    dim = spec["head_dim"]
    # _compute_default_rope_parameters: 1 / base^(arange(0, dim, 2) / dim)
    inv_freq = 1.0 / (spec["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rope_type, sc = spec["rope_type"], spec["rope_scaling"]
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        # _compute_linear_scaling_rope_parameters: inv_freq / factor (== positions / factor)
        return inv_freq / float(sc["factor"])
    if rope_type == "llama3":
        return llama3_inv_freq(inv_freq, float(sc["factor"]), float(sc["low_freq_factor"]),
                               float(sc["high_freq_factor"]),
                               float(sc["original_max_position_embeddings"]))
    raise NotImplementedError("rope_type %r" % rope_type)


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    """_compute_llama3_parameters, step for step."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # wavelen < high_freq_wavelen: unchanged; wavelen > low_freq_wavelen: divided by factor
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # in between: interpolate with a smooth factor
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(inv_freq, positions):
    """LlamaRotaryEmbedding.forward: freqs = pos x inv_freq, emb = cat(freqs, freqs)."""
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    """modeling_llama.rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last axis."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, cos, sin):
    """modeling_llama.apply_rotary_pos_emb for x of shape [heads, T, head_dim]."""
    return x * cos[None] + rotate_half(x) * sin[None]


# ----------------------------------------------------------------------------------------------
# Forward pass
# ----------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def linear(x, weights, prefix, bias):
    """nn.Linear: x @ W.T (+ b)."""
    y = x @ weights[prefix + ".weight"].T
    if bias:
        y = y + weights[prefix + ".bias"]
    return y


def silu(x):
    return x / (1.0 + np.exp(-x))


def attention(spec, weights, prefix, x, cos, sin):
    """LlamaAttention.forward with eager_attention_forward (causal, no dropout)."""
    t = x.shape[0]
    nh, nkv, hd = spec["heads"], spec["kv_heads"], spec["head_dim"]
    q = linear(x, weights, prefix + ".q_proj", spec["qkv_bias"]).reshape(t, nh, hd)
    k = linear(x, weights, prefix + ".k_proj", spec["qkv_bias"]).reshape(t, nkv, hd)
    v = linear(x, weights, prefix + ".v_proj", spec["qkv_bias"]).reshape(t, nkv, hd)
    q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))  # [heads, T, head_dim]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # repeat_kv: query head h reads kv head h // (nh / nkv)
    k = np.repeat(k, nh // nkv, axis=0)
    v = np.repeat(v, nh // nkv, axis=0)
    scores = (q @ k.transpose(0, 2, 1)) * hd ** -0.5
    future = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores = np.where(future[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(t, nh * hd)
    return linear(out, weights, prefix + ".o_proj", spec["o_bias"])


def mlp(spec, weights, prefix, x):
    """LlamaMLP: down(silu(gate(x)) * up(x))."""
    b = spec["mlp_bias"]
    gate = linear(x, weights, prefix + ".gate_proj", b)
    up = linear(x, weights, prefix + ".up_proj", b)
    return linear(silu(gate) * up, weights, prefix + ".down_proj", b)


def forward(spec, weights, ids):
    """LlamaForCausalLM.forward for one sequence at positions 0..len-1 -> logits [T, vocab]."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("ids must be a non-empty list")
    if ids.min() < 0 or ids.max() >= spec["vocab"]:
        raise ValueError("token id out of range [0, %d)" % spec["vocab"])
    cos, sin = rope_cos_sin(rope_inv_freq(spec), np.arange(ids.size))
    x = weights["model.embed_tokens.weight"][ids]
    for i in range(spec["layers"]):
        p = "model.layers.%d" % i
        # LlamaDecoderLayer.forward: pre-norm residual blocks
        h = rms_norm(x, weights[p + ".input_layernorm.weight"], spec["eps"])
        x = x + attention(spec, weights, p + ".self_attn", h, cos, sin)
        h = rms_norm(x, weights[p + ".post_attention_layernorm.weight"], spec["eps"])
        x = x + mlp(spec, weights, p + ".mlp", h)
    x = rms_norm(x, weights["model.norm.weight"], spec["eps"])
    if spec["tied"]:
        # tie_word_embeddings: lm_head shares the embedding matrix (and is not saved)
        head = weights["model.embed_tokens.weight"]
    else:
        head = weights["lm_head.weight"]
    return x @ head.T


def run(model_dir, id_lists):
    """Logits (list of [T, vocab] float64 arrays) for each id list."""
    spec = load_config(model_dir)
    weights = load_weights(model_dir)
    return [forward(spec, weights, ids) for ids in id_lists]


def parse_ids(text):
    return [int(tok) for tok in text.split(",") if tok.strip() != ""]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--ids", action="append", required=True,
                        help="comma-separated token ids; repeat for more sequences")
    args = parser.parse_args(argv)
    logits = run(args.model, [parse_ids(s) for s in args.ids])
    json.dump({"logits": [l.tolist() for l in logits]}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
