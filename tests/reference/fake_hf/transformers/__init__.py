"""Stand-in for transformers 5's Llama/Qwen2/Mistral classes, for test_hf_parity_offline.py.

Its "forward" is llama_ref itself, so a run through it checks the parity script's plumbing,
not the maths. It behaves like v5 where the script must adapt: configs take rope_parameters,
_from_config takes dtype= (torch_dtype= raises TypeError), save_pretrained has no
safe_serialization.
"""
import json
import os
import sys
import tempfile
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import llama_ref  # noqa: E402
import tiny_model  # noqa: E402

__version__ = "5.0-fake"
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float64": "F64"}


class _Config:
    model_type = None

    def __init__(self, vocab_size=1000, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=None,
                 head_dim=None, rms_norm_eps=1e-6, max_position_embeddings=2048,
                 tie_word_embeddings=False, rope_parameters=None, attention_bias=False,
                 mlp_bias=False, **extra):
        fields = dict(locals())
        for key in ("self", "extra", "__class__"):
            fields.pop(key, None)
        fields.update(extra, model_type=self.model_type)
        fields["rope_parameters"] = rope_parameters or {"rope_type": "default",
                                                        "rope_theta": 10000.0}
        self.fields = fields
        self.tie_word_embeddings = tie_word_embeddings

    _attn_implementation = property(lambda self: self.fields.get("_attn", "sdpa"),
                                    lambda self, v: self.fields.__setitem__("_attn", v))


class LlamaConfig(_Config):
    model_type = "llama"


class Qwen2Config(_Config):
    model_type = "qwen2"


class MistralConfig(_Config):
    model_type = "mistral"


def _bias_kinds(fields):
    if fields["model_type"] == "qwen2":
        return {"qkv"}
    kinds = {"qkv", "o"} if fields["attention_bias"] else set()
    return kinds | ({"mlp"} if fields["mlp_bias"] else set())


class _Model:
    def __init__(self, config):
        self.config = config
        weights = tiny_model.random_weights(config.fields, 0, _bias_kinds(config.fields))
        self.params = {k: torch.Tensor(v) for k, v in weights.items()}
        self._tmp = tempfile.TemporaryDirectory()  # removed with the model
        self.config_dir = self._tmp.name
        self._write_config(self.config_dir)
        inv_freq = llama_ref.rope_inv_freq(llama_ref.load_config(self.config_dir))
        self.model = types.SimpleNamespace(rotary_emb=types.SimpleNamespace(
            inv_freq=torch.Tensor(inv_freq.astype(np.float32))))

    @classmethod
    def _from_config(cls, config, **kwargs):
        if set(kwargs) - {"dtype", "attn_implementation"}:
            raise TypeError("unexpected keyword arguments %s" % sorted(kwargs))
        model = cls(config)
        if "attn_implementation" in kwargs:
            config._attn_implementation = kwargs["attn_implementation"]
        return model.to(kwargs.get("dtype", torch.float32))

    def _write_config(self, path):
        fields = {k: v for k, v in self.config.fields.items() if not k.startswith("_")}
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(fields, f)

    def named_parameters(self):
        return list(self.params.items())

    def get_input_embeddings(self):
        return types.SimpleNamespace(weight=self.params["model.embed_tokens.weight"])

    def get_output_embeddings(self):
        return types.SimpleNamespace(weight=self.params.get("lm_head.weight",
                                                            self.params["model.embed_tokens.weight"]))

    def tie_weights(self):
        pass

    def to(self, target):
        if target in _ST_DTYPES:
            self.params = {k: v.to(target) for k, v in self.params.items()}
        return self

    def eval(self):
        return self

    def save_pretrained(self, path, max_shard_size=None, **kwargs):
        if "safe_serialization" in kwargs:
            raise TypeError("safe_serialization was removed in v5")
        dtype = _ST_DTYPES[self.params["model.norm.weight"].dtype]
        weights = {k: v.a for k, v in self.params.items()}
        tiny_model.write_model(path, {k: v for k, v in self.config.fields.items()
                                      if not k.startswith("_")},
                               weights, dtype, 3 if max_shard_size else 1)

    def __call__(self, input_ids=None, use_cache=True):
        del use_cache
        spec = llama_ref.load_config(self.config_dir)
        logits = llama_ref.forward(spec, {k: v.a for k, v in self.params.items()},
                                   input_ids.a[0])
        return types.SimpleNamespace(logits=torch.Tensor(logits[None]))


class LlamaForCausalLM(_Model):
    pass


class Qwen2ForCausalLM(_Model):
    pass


class MistralForCausalLM(_Model):
    pass
