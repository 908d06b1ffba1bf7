"""Writes the Hugging Face model directory: config.json, model.safetensors (float32), generation_config.json,
tokenizer.json and tokenizer_config.json (ChatML chat template)."""
import json
import os
import struct

from . import bpe

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].float().contiguous()
        data = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def _dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_model_dir(out, model, encoder, seq_len):
    os.makedirs(out, exist_ok=True)
    cfg = model.cfg
    eot, im_end = encoder.special_ids["<|endoftext|>"], encoder.special_ids["<|im_end|>"]
    _dump(os.path.join(out, "config.json"), {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": False, "attention_dropout": 0.0,
        "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
        "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32"})
    _dump(os.path.join(out, "generation_config.json"),
          {"bos_token_id": eot, "eos_token_id": [eot, im_end], "do_sample": False})
    write_safetensors(os.path.join(out, "model.safetensors"), model.hf_state_dict(), {"format": "pt"})
    bpe.write_tokenizer_json(encoder, os.path.join(out, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for s, i in encoder.special_ids.items()}
    _dump(os.path.join(out, "tokenizer_config.json"), {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": added, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": seq_len,
        "clean_up_tokenization_spaces": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE})
