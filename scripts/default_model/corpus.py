"""The public-domain training corpus: the King James Bible (Debian's bible-kjv), the fortune cookie
databases (fortunes, fortunes-min; the offensive set is left out) and this repository's own Markdown
documentation. Some fortunes and single verses are wrapped in ChatML so the model has seen the chat format
that kvfleet's chat endpoint sends."""
import os
import random
import re
import subprocess

FORTUNE_DIR = "/usr/share/games/fortunes"
SKIP_FORTUNES = {"ascii-art", "translate-me"}  # drawings and non-English text
SYSTEM = "You are a small model trained on the King James Bible and fortune cookies."
FORTUNE_ASKS = ["Tell me a fortune.", "Say something wise.", "Tell me something funny."]
VERSE_ASKS = ["Give me a verse.", "Quote the Bible."]
VERSE_RE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def kjv_chapters():
    text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                          text=True).stdout
    chapters, key = [], None
    for line in text.splitlines():
        m = VERSE_RE.match(line)
        if not m:
            raise RuntimeError(f"unexpected line from bible: {line[:80]!r}")
        if (m.group(1), m.group(2)) != key:
            key = (m.group(1), m.group(2))
            chapters.append([])
        chapters[-1].append(m.group(4).strip())
    return ["\n".join(verses) for verses in chapters]


def fortunes():
    out = []
    for name in sorted(os.listdir(FORTUNE_DIR)):
        path = os.path.join(FORTUNE_DIR, name)
        if not os.path.isfile(path) or "." in name or name in SKIP_FORTUNES:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for item in f.read().split("\n%\n"):
                item = "\n".join(line.rstrip() for line in item.strip("%\n").splitlines()).strip()
                if item:
                    out.append(item)
    return out


def repo_docs(root):
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("build", "models"))
        for f in sorted(files):
            if f.endswith(".md"):
                with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                    out.append(fh.read().strip())
    return out


def chat(rng, ask, answer):
    q = rng.choice(ask)
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
            f"<|im_start|>assistant\n{answer}<|im_end|>")


def build(root, seed, holdout_every=50):
    """Returns (train documents, validation documents, held-out plain text for the parity fixture)."""
    rng = random.Random(seed)
    chapters, cookies, docs = kjv_chapters(), fortunes(), repo_docs(root)
    train, val = [], []
    for i, ch in enumerate(chapters):
        (val if i % holdout_every == holdout_every // 2 else train).append(ch)
    verses = [v for ch in train for v in ch.split("\n")]
    train += [chat(rng, VERSE_ASKS, v) for v in rng.sample(verses, 4000)]
    for i, c in enumerate(cookies):
        doc = chat(rng, FORTUNE_ASKS, c) if rng.random() < 0.5 else c
        (val if i % holdout_every == holdout_every // 2 else train).append(doc)
    train += docs
    heldout_chapter = chapters[holdout_every // 2]
    heldout_fortune = next(c for i, c in enumerate(cookies) if i % holdout_every == holdout_every // 2)
    stats = {"kjv_chapters": len(chapters), "kjv_chars": sum(map(len, chapters)), "fortunes": len(cookies),
             "fortune_chars": sum(map(len, cookies)), "docs": len(docs), "doc_chars": sum(map(len, docs))}
    rng.shuffle(train)
    return train, val, heldout_chapter + "\n\n" + heldout_fortune + "\n", stats
