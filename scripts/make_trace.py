#!/usr/bin/env python3
"""Write a request trace in the Mooncake (FAST'25) format, deterministic from --seed.

One JSON object per line, sorted by time: {"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}, one hash id per 512-token block of the prompt. Two prompts share a leading run of ids
exactly where they share a prefix; the last block of a prompt may be partial, and once a later prompt
fills it the filled block gets a new id (its content changed). `kvfleet-bench serve --dataset-name trace
--trace-file F` replays it.

Kinds:
  chat      conversations that grow turn by turn: a system prompt shared by many conversations (whole
            512-token blocks), then per turn a new user message; the next turn resends everything so far,
            the model's answer included, plus the new message. Turns come --think-time seconds apart.
  agent     tool-agent loops: a shared system prompt and a task, then --tool-calls steps that each append
            the call and a short tool result and resend everything, --tool-time seconds apart.
  no-reuse  --requests independent prompts that share nothing.
  mix       chat and agent sessions interleaved in one trace.

Sessions start as a Poisson process at --rate per second. Lengths are drawn uniformly from
[0.5 x mean, 1.5 x mean]. Uses the Python standard library only.
"""
import argparse
import json
import random
import sys

BLOCK = 512


class Ids:
    """Hands out fresh hash ids."""

    def __init__(self):
        self.next = 0

    def take(self, n):
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


class Context:
    """A growing prompt: its length in tokens and the hash ids of its blocks."""

    def __init__(self, ids, prefix_ids, prefix_tokens):
        self.ids = ids
        self.hash_ids = list(prefix_ids)
        self.tokens = prefix_tokens

    def extend(self, tokens):
        # A partial last block changes content when the context grows: it gets a new id.
        full = self.tokens // BLOCK
        self.tokens += tokens
        blocks = -(-self.tokens // BLOCK)
        self.hash_ids = self.hash_ids[:full] + self.ids.take(blocks - full)


def length(rng, mean):
    return max(1, int(rng.uniform(0.5 * mean, 1.5 * mean)))


def line(ts, ctx, output):
    return {"timestamp": round(ts * 1000), "input_length": ctx.tokens, "output_length": output,
            "hash_ids": list(ctx.hash_ids)}


def system_prompts(a, ids):
    return [ids.take(a.system_blocks) for _ in range(a.system_prompts)]


def session(a, rng, ids, systems, start, steps, gap, new_tokens, output_mean):
    """One conversation or agent loop: `steps` requests, each resending the context plus new tokens."""
    system = rng.choice(systems) if systems else []
    ctx = Context(ids, system, len(system) * BLOCK)
    out, ts, answer = [], start, 0
    for _ in range(steps):
        ctx.extend(answer + length(rng, new_tokens))
        answer = length(rng, output_mean)
        out.append(line(ts, ctx, answer))
        ts += rng.expovariate(1.0 / gap) if gap > 0 else 0.0
    return out


def chat(a, rng, ids, systems, start):
    return session(a, rng, ids, systems, start, a.turns, a.think_time, a.user_tokens, a.output_tokens)


def agent(a, rng, ids, systems, start):
    task = session(a, rng, ids, systems, start, 1, 0, a.user_tokens, a.tool_output_tokens)
    ctx_lines = task
    # The loop resends the growing context: each step adds the model's call and the tool's result.
    last = task[-1]
    ctx = Context(ids, last["hash_ids"], last["input_length"])
    ts, answer = start, last["output_length"]
    for _ in range(a.tool_calls):
        ts += rng.expovariate(1.0 / a.tool_time) if a.tool_time > 0 else 0.0
        ctx.extend(answer + length(rng, a.tool_result_tokens))
        answer = length(rng, a.tool_output_tokens)
        ctx_lines.append(line(ts, ctx, answer))
    return ctx_lines


def no_reuse(a, rng, ids):
    out, ts = [], 0.0
    for _ in range(a.requests):
        ctx = Context(ids, [], 0)
        ctx.extend(length(rng, a.input_tokens))
        out.append(line(ts, ctx, length(rng, a.output_tokens)))
        ts += rng.expovariate(a.rate)
    return out


def generate(a):
    rng = random.Random(a.seed)
    ids = Ids()
    if a.kind == "no-reuse":
        return no_reuse(a, rng, ids)
    systems = system_prompts(a, ids)
    kinds = {"chat": [chat] * a.sessions, "agent": [agent] * a.sessions,
             "mix": [chat if i % 2 == 0 else agent for i in range(a.sessions)]}[a.kind]
    out, start = [], 0.0
    for make in kinds:
        out.extend(make(a, rng, ids, systems, start))
        start += rng.expovariate(a.rate)
    out.sort(key=lambda r: r["timestamp"])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=["chat", "agent", "no-reuse", "mix"], default="chat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write here (default: stdout)")
    p.add_argument("--sessions", type=int, default=32, help="conversations / agent loops")
    p.add_argument("--rate", type=float, default=1.0, help="sessions (no-reuse: requests) started per second")
    p.add_argument("--system-prompts", type=int, default=4, help="distinct shared system prompts (0: none)")
    p.add_argument("--system-blocks", type=int, default=4, help="512-token blocks per system prompt")
    p.add_argument("--turns", type=int, default=6, help="chat: turns per conversation")
    p.add_argument("--think-time", type=float, default=10.0, help="chat: mean seconds between turns")
    p.add_argument("--user-tokens", type=int, default=300, help="mean new user tokens per turn (agent: the task)")
    p.add_argument("--output-tokens", type=int, default=200, help="mean answer tokens (chat, no-reuse)")
    p.add_argument("--tool-calls", type=int, default=8, help="agent: tool calls per loop")
    p.add_argument("--tool-time", type=float, default=1.0, help="agent: mean seconds per tool call")
    p.add_argument("--tool-result-tokens", type=int, default=150, help="agent: mean tokens of a tool result")
    p.add_argument("--tool-output-tokens", type=int, default=40, help="agent: mean tokens of a call")
    p.add_argument("--requests", type=int, default=200, help="no-reuse: requests")
    p.add_argument("--input-tokens", type=int, default=2048, help="no-reuse: mean prompt tokens")
    a = p.parse_args(argv)
    for name in ("sessions", "turns", "requests", "system_blocks", "system_prompts", "tool_calls"):
        if getattr(a, name) < 0:
            p.error("--%s must be >= 0" % name.replace("_", "-"))
    if a.rate <= 0:
        p.error("--rate must be > 0")
    lines = generate(a)
    out = open(a.out, "w") if a.out else sys.stdout
    for r in lines:
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
    if a.out:
        out.close()


if __name__ == "__main__":
    main()
