"""A Llama-architecture decoder in plain PyTorch, laid out like transformers' LlamaForCausalLM so that its
state_dict names are the Hugging Face tensor names (RMSNorm, rotate-half RoPE, SwiGLU MLP, grouped-query
attention, optionally tied embeddings). Written for torch 1.13 (no scaled_dot_product_attention)."""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(cfg, positions):
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, d, kv = cfg.num_attention_heads, cfg.head_dim, cfg.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h, d, kv = self.cfg.num_attention_heads, self.cfg.head_dim, self.cfg.num_key_value_heads
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if kv != h:  # transformers' repeat_kv: query head i reads kv head i // (h / kv)
            k = k.repeat_interleave(h // kv, dim=1)
            v = v.repeat_interleave(h // kv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d) + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(b, t, h * d)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._init_weights()

    def _init_weights(self):
        residual_std = 0.02 / math.sqrt(2 * self.cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids):
        t = ids.shape[1]
        cos, sin = rope_tables(self.cfg, torch.arange(t, device=ids.device))
        cos, sin = cos.to(ids.device), sin.to(ids.device)
        mask = torch.full((t, t), float("-inf"), device=ids.device).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))

    def hf_state_dict(self):
        """Tensor name -> tensor, as transformers names them (lm_head left out when tied)."""
        sd = {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items()}
        if self.cfg.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())


@torch.no_grad()
def greedy(model, ids, n_new):
    """Greedy continuation without a KV cache (the model is small; full recompute keeps it obviously right)."""
    out = list(ids)
    for _ in range(n_new):
        logits = model(torch.tensor([out], device=next(model.parameters()).device))[0, -1]
        out.append(int(torch.argmax(logits).item()))
    return out[len(ids):]


@torch.no_grad()
def window_nll(model, ids, context):
    """Sum of NLL and count over non-overlapping windows of `context` tokens; inside each window every token
    but the first is predicted from the ones before it in that window (what `kvfleet perplexity` does)."""
    dev = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(ids), context):
        w = ids[start:start + context]
        if len(w) < 2:
            continue
        x = torch.tensor([w], device=dev)
        logp = torch.log_softmax(model(x)[0].double(), dim=-1)
        tgt = x[0, 1:]
        total += float(-logp[:-1].gather(1, tgt[:, None]).sum().item())
        count += len(w) - 1
    return total, count
