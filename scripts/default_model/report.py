"""After training: measures train/validation loss, writes the Hugging Face directory, the parity fixtures
(eval/reference.json + eval/heldout.txt, read by tests/default_model) and MODEL_CARD.md."""
import json
import math
import os
import sys

import torch

from . import export
from .llama import greedy, window_nll

TOKENIZER_SAMPLES = [
    "In the beginning God created the heaven and the earth.",
    "Don't   panic!\n\n  It's 1611 A.D.; they'll say: \"Amen\" -- 42 times.\t\tEnd  ",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F642 x\u00b2+y\u00b2 \u2014 \u00bfQu\u00e9?\r\n",
]


def _fixtures(model, enc, data, args, openings):
    heldout = data["heldout"]
    ids = enc.encode(heldout)
    nll, count = window_nll(model, ids, args.seq_len)
    conts = []
    for text in openings:
        p = enc.encode(text)
        c = greedy(model, p, args.greedy_tokens)
        conts.append({"prompt": text, "prompt_ids": p, "continuation_ids": c, "continuation": enc.decode(c)})
    samples = [{"text": t, "ids": enc.encode(t)} for t in TOKENIZER_SAMPLES]
    return {"heldout_file": "heldout.txt", "heldout_ids": ids, "context": args.seq_len, "nll_sum": nll,
            "tokens_scored": count, "mean_nll": nll / count, "perplexity": math.exp(nll / count),
            "greedy": conts, "tokenizer_samples": samples}


def finish(model, enc, data, args, steps, seconds, openings, eval_loss, encode_doc):
    out = args.out
    train_loss = eval_loss(model, data["train"], args, max_windows=args.eval_windows)
    val_loss = eval_loss(model, data["val"], args, max_windows=args.eval_windows)
    export.write_model_dir(out, model, enc, args.seq_len)
    model = model.float()
    fx = _fixtures(model, enc, data, args, openings)
    os.makedirs(os.path.join(out, "eval"), exist_ok=True)
    with open(os.path.join(out, "eval", "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(data["heldout"])
    with open(os.path.join(out, "eval", "reference.json"), "w", encoding="utf-8") as f:
        json.dump(fx, f, indent=1, ensure_ascii=False)
        f.write("\n")
    stats = {"steps": steps, "tokens_seen": steps * args.batch * args.seq_len, "seconds": seconds,
             "train_loss": train_loss, "val_loss": val_loss, "params": model.num_parameters(),
             "train_tokens": len(data["train"]), "val_tokens": len(data["val"])}
    with open(os.path.join(out, "MODEL_CARD.md"), "w", encoding="utf-8") as f:
        f.write(model_card(model, enc, data, args, stats, fx))
    print(json.dumps({k: v for k, v in stats.items()}, indent=1))
    for g in fx["greedy"]:
        print(f"{g['prompt']!r} -> {g['continuation']!r}")
    print(f"held-out perplexity (context {args.seq_len}): {fx['perplexity']:.4f}")


def _command(args):
    flags = ["--hidden", args.hidden, "--intermediate", args.intermediate, "--layers", args.layers, "--heads",
             args.heads, "--kv-heads", args.kv_heads, "--vocab", args.vocab, "--seq-len", args.seq_len,
             "--batch", args.batch, "--steps", args.steps, "--lr", args.lr, "--warmup", args.warmup,
             "--seed", args.seed, "--threads", args.threads]
    if args.stop_after and args.stop_after < args.steps:
        flags += ["--stop-after", args.stop_after]
    return "scripts/train-default-model " + " ".join(str(x) for x in flags)


def _schedule_note(args, st):
    if st["steps"] >= args.steps:
        return ""
    return (f" (the cosine schedule spans {args.steps} steps; training stopped after {st['steps']} to fit the"
            f" time available, so the learning rate had not fully decayed)")


def model_card(model, enc, data, args, st, fx):
    c, s = model.cfg, data["stats"]
    rows = "\n".join(f"| `{g['prompt']}` | {g['continuation']!r} |" for g in fx["greedy"])
    return f"""# kvfleet-default

A small Llama-architecture language model trained from scratch by `scripts/train-default-model`, so that
kvfleet's demo and tests run on a model that speaks (KJV-flavoured) English instead of random weights. It is
a toy: {st['params'] / 1e6:.2f}M parameters trained for {st['steps']} steps on a 2-core CPU. Expect
Bible-like and fortune-like word sequences, not answers.

## Data
Freely redistributable English text from Debian packages plus this repository:
- the King James Bible (package bible-kjv-text, public domain): {s['kjv_chapters']} chapters,
  {s['kjv_chars']:,} characters, one verse per line, one chapter per document;
- the fortune cookie databases (packages fortunes, fortunes-min; the offensive set is not installed/used;
  ascii-art and translate-me left out): {s['fortunes']:,} fortunes, {s['fortune_chars']:,} characters;
  half of them, and 4,000 single verses, wrapped in ChatML (system/user/assistant) so the chat format is known;
- kvfleet's own Markdown documentation ({s['docs']} files, {s['doc_chars']:,} characters).

Every 50th chapter and every 50th fortune is held out for validation. Train stream {st['train_tokens']:,}
tokens, validation {st['val_tokens']:,} tokens (documents separated by `<|endoftext|>`).

## Licence
Weights, tokenizer and this card: Apache-2.0, as kvfleet (LICENSE). The King James Bible text is in the
public domain. The fortune databases are quotations collected by the BSD fortune program and redistributed
by Debian under that package's terms (/usr/share/doc/fortunes-min/copyright); not every quotation in them is
itself public domain, so treat the model's fortune-like output accordingly. The documentation is kvfleet's.

## Tokenizer
Byte-level BPE trained by `scripts/default_model/bpe.py` (GPT-2 ByteLevel pre-tokenizer and regex split, no
normalizer), {enc.vocab_size} tokens: 256 bytes, {len(enc.merges)} merges, and the special tokens
`<|endoftext|>` ({enc.special_ids['<|endoftext|>']}), `<|im_start|>` ({enc.special_ids['<|im_start|>']}),
`<|im_end|>` ({enc.special_ids['<|im_end|>']}). No BOS is added. Chat template: ChatML.

## Architecture
LlamaForCausalLM: hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} attention
heads of {c.head_dim}, {c.num_key_value_heads} KV heads (GQA), SwiGLU MLP {c.intermediate_size}, RMSNorm
(eps {c.rms_norm_eps}), RoPE theta {c.rope_theta:g}, tied embeddings, float32 weights.
Parameters: {st['params']:,}. Trained context: {args.seq_len} tokens (max_position_embeddings
{c.max_position_embeddings}, beyond {args.seq_len} untrained).

## Training
AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak learning rate {args.lr:g}, {args.warmup} warmup
steps, cosine decay to 10%, gradient clipping 1.0, batch {args.batch} x {args.seq_len} tokens,
{st['steps']} steps{_schedule_note(args, st)} = {st['tokens_seen']:,} tokens seen (about {st['tokens_seen'] / st['train_tokens']:.2f}
epochs), seed {args.seed}, device {args.dev}, {st['seconds'] / 60:.0f} minutes.

| | loss (nats/token) | perplexity |
|---|---|---|
| train (first {args.eval_windows} windows of the stream) | {st['train_loss']:.4f} | {math.exp(st['train_loss']):.2f} |
| validation (first {args.eval_windows} windows; all of it when fewer) | {st['val_loss']:.4f} | {math.exp(st['val_loss']):.2f} |
| eval/heldout.txt, windows of {fx['context']} (`kvfleet perplexity`) | {fx['mean_nll']:.4f} | {fx['perplexity']:.2f} |

Greedy continuations ({args.greedy_tokens} tokens, PyTorch; kvfleet's equal them, tests/default_model):

| opening | continuation |
|---|---|
{rows}

## Reproduce
```
{_command(args)}
```
The corpus includes the repository's Markdown files as they are when the command runs, so a later checkout
gives a slightly different corpus. Training is seeded (data order, initialisation); a rerun on the same
CPU, thread count and BLAS should give the same weights, but no second run has checked that yet.
`eval/reference.json` holds the PyTorch model's token ids, perplexity and greedy continuations that the C++
tests compare against.
"""
