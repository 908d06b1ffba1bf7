#!/usr/bin/env python3
"""Trains kvfleet's default model: a byte-level BPE tokenizer and a small Llama on a public-domain corpus,
written as a Hugging Face directory with a model card and the parity fixtures the C++ tests read.
Run through scripts/train-default-model. Seeded (data order, initialisation), so the same flags on the same
corpus, device, thread count and BLAS should give the same model (not yet checked by a second run)."""
import argparse
import json
import math
import os
import random
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from default_model import bpe, corpus, export  # noqa: E402
from default_model.llama import LlamaConfig, LlamaForCausalLM, greedy, window_nll  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPENINGS = ["In the beginning God created", "And God said, Let there be", "The LORD is my shepherd"]
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in bpe.SPECIAL_TOKENS) + ")")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=os.path.join(ROOT, "models", "kvfleet-default"))
    p.add_argument("--work", default=os.path.join(ROOT, "build", "default-model-work"))
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=688)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--measure", type=int, default=0, help="time this many steps, print tokens/s and stop")
    p.add_argument("--stop-after", type=int, default=0,
                   help="stop after this many steps (the learning-rate schedule still spans --steps)")
    p.add_argument("--export-from", help="skip training: export this checkpoint (work/ckpt.pt)")
    p.add_argument("--wall-minutes", type=float, default=float("nan"),
                   help="with --export-from: the training time to state in the model card")
    p.add_argument("--eval-windows", type=int, default=200, help="windows of --seq-len for the final losses")
    p.add_argument("--greedy-tokens", type=int, default=32)
    return p.parse_args()


def log(msg):
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def encode_doc(enc, text):
    ids = []
    for part in SPECIAL_RE.split(text):
        if part in enc.special_ids:
            ids.append(enc.special_ids[part])
        elif part:
            ids.extend(enc.encode(part))
    return ids


def prepare_data(args):
    """Corpus, tokenizer and token streams; cached in the work folder (keyed by seed and vocabulary)."""
    cache = os.path.join(args.work, f"data-v{args.vocab}-s{args.seed}.pt")
    if os.path.exists(cache):
        log(f"data from cache {cache}")
        return torch.load(cache)
    train_docs, val_docs, heldout, stats = corpus.build(ROOT, args.seed)
    log(f"corpus: {len(train_docs)} train / {len(val_docs)} validation documents, {stats}")
    t0 = time.time()
    counts = bpe.count_words(SPECIAL_RE.sub(" ", d) for d in train_docs)
    merges = bpe.train(counts, args.vocab, log=log)
    enc = bpe.Encoder(merges)
    log(f"tokenizer: {enc.vocab_size} tokens in {time.time() - t0:.0f}s")
    eot = enc.special_ids["<|endoftext|>"]

    def stream(docs):
        ids = []
        for d in docs:
            ids.extend(encode_doc(enc, d))
            ids.append(eot)
        return torch.tensor(ids, dtype=torch.int64)

    data = {"merges": merges, "train": stream(train_docs), "val": stream(val_docs), "heldout": heldout,
            "stats": stats}
    log(f"tokens: train {len(data['train'])}, validation {len(data['val'])}")
    os.makedirs(args.work, exist_ok=True)
    torch.save(data, cache)
    return data


def lr_at(args, step):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def make_optimizer(model, args):
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def eval_loss(model, stream, args, max_windows=200):
    model.eval()
    t, total, count = args.seq_len, 0.0, 0
    n = min(max_windows, (len(stream) - 1) // t)
    for i in range(n):
        x = stream[i * t:(i + 1) * t + 1].to(args.dev)
        logits = model(x[None, :-1])[0]
        total += float(torch.nn.functional.cross_entropy(logits.float(), x[1:], reduction="sum"))
        count += t
    model.train()
    return total / count


def train(model, data, args):
    opt = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    stream, t, b = data["train"], args.seq_len, args.batch
    steps = args.measure or min(args.steps, args.stop_after or args.steps)
    t0, last, last_step, loss_ema = time.time(), time.time(), 0, None
    for step in range(steps):
        offs = torch.randint(0, len(stream) - t - 1, (b,), generator=gen)
        batch = torch.stack([stream[o:o + t + 1] for o in offs.tolist()]).to(args.dev)
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = float(loss) if loss_ema is None else 0.9 * loss_ema + 0.1 * float(loss)
        if (step + 1) % args.log_every == 0 or step + 1 == steps:
            now = time.time()
            tps = (step + 1 - last_step) * b * t / (now - last)
            eta = (steps - step - 1) * (now - t0) / (step + 1)
            log(f"step {step + 1}/{steps} loss {float(loss):.3f} (avg {loss_ema:.3f}) lr {lr_at(args, step):.2e} "
                f"{tps:.0f} tok/s ETA {eta / 60:.1f} min")
            last, last_step = now, step + 1
        if not args.measure and ((step + 1) % args.ckpt_every == 0 or step + 1 == steps):
            torch.save({"model": model.state_dict(), "step": step + 1, "loss_ema": loss_ema},
                       os.path.join(args.work, "ckpt.pt"))
    return steps, time.time() - t0


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    args.dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                            args.device if args.device != "auto" else "cpu")
    data = prepare_data(args)
    enc = bpe.Encoder(data["merges"])
    cfg = LlamaConfig(vocab_size=enc.vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=max(1024, args.seq_len))
    model = LlamaForCausalLM(cfg).to(args.dev)
    log(f"model: {model.num_parameters() / 1e6:.2f}M parameters, {cfg.to_dict()}, device {args.dev}")
    if args.export_from:
        ckpt = torch.load(args.export_from, map_location=args.dev)
        model.load_state_dict(ckpt["model"])
        steps, seconds = ckpt["step"], args.wall_minutes * 60
    else:
        steps, seconds = train(model, data, args)
        if args.measure:
            return
    from default_model import report
    report.finish(model.eval(), enc, data, args, steps, seconds, OPENINGS, eval_loss, encode_doc)


if __name__ == "__main__":
    main()
