"""Writes tiny Hugging Face style model directories (config.json + safetensors) with numpy.

Used by test_llama_ref.py; kept separate so the writer and the reader in llama_ref.py are two
independent pieces of code (a shared bug would otherwise cancel out).
"""

import json
import os
import struct

import numpy as np


def to_bf16_bits(values):
    """float -> bfloat16 bit patterns, round to nearest even (as torch's .to(bfloat16))."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def bf16_round(values):
    """The float64 values that survive a trip through bfloat16."""
    bits = to_bf16_bits(values).astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def _encode(array, dtype):
    if dtype == "F32":
        return np.asarray(array, dtype="<f4").tobytes()
    if dtype == "F64":
        return np.asarray(array, dtype="<f8").tobytes()
    if dtype == "F16":
        return np.asarray(array, dtype="<f2").tobytes()
    if dtype == "BF16":
        return to_bf16_bits(array).astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype="F32"):
    """tensors: {name: ndarray}; all stored as dtype. Header padded to 8 bytes like the
    reference writer, with a __metadata__ entry the reader must skip."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        blob = _encode(tensors[name], dtype)
        shape = list(np.shape(tensors[name]))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_model(model_dir, config, weights, dtype="F32", shards=1):
    """Writes config.json and either model.safetensors or `shards` files plus the index."""
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if shards == 1:
        write_safetensors(os.path.join(model_dir, "model.safetensors"), weights, dtype)
        return
    names = sorted(weights)
    weight_map = {}
    for s in range(shards):
        file_name = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: weights[n] for n in names[s::shards]}
        write_safetensors(os.path.join(model_dir, file_name), part, dtype)
        weight_map.update({n: file_name for n in part})
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


def base_config(**overrides):
    config = {
        "model_type": "llama",
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "vocab_size": 40,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    config.update(overrides)
    return config


def random_weights(config, seed, with_biases=None, lm_head=None):
    """Random HF-named weights for config. with_biases: set of projection kinds ('qkv', 'o',
    'mlp') to give bias tensors. lm_head defaults to (not tie_word_embeddings)."""
    rng = np.random.default_rng(seed)
    with_biases = with_biases or set()
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or hidden // heads

    def mat(rows, cols):
        return rng.standard_normal((rows, cols)) / np.sqrt(cols)

    w = {"model.embed_tokens.weight": rng.standard_normal((config["vocab_size"], hidden)),
         "model.norm.weight": 1.0 + 0.1 * rng.standard_normal(hidden)}
    for i in range(config["num_hidden_layers"]):
        p = "model.layers.%d." % i
        shapes = {"self_attn.q_proj": (heads * hd, hidden), "self_attn.k_proj": (kv * hd, hidden),
                  "self_attn.v_proj": (kv * hd, hidden), "self_attn.o_proj": (hidden, heads * hd),
                  "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                  "mlp.down_proj": (hidden, inter)}
        for name, (rows, cols) in shapes.items():
            w[p + name + ".weight"] = mat(rows, cols)
            kind = "mlp" if name.startswith("mlp") else ("o" if name.endswith("o_proj") else "qkv")
            if kind in with_biases:
                w[p + name + ".bias"] = 0.3 * rng.standard_normal(rows)
        w[p + "input_layernorm.weight"] = 1.0 + 0.1 * rng.standard_normal(hidden)
        w[p + "post_attention_layernorm.weight"] = 1.0 + 0.1 * rng.standard_normal(hidden)
    if lm_head is None:
        lm_head = not config.get("tie_word_embeddings", False)
    if lm_head:
        w["lm_head.weight"] = mat(config["vocab_size"], hidden)
    return w
