"""Byte-level BPE (GPT-2 style) in plain Python: trainer, encoder and the tokenizer.json writer.

No `regex` module on Debian 12's Python, so the GPT-2 pre-tokenizer pattern
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
is written out as a scanner (pretokenize). Merges are applied lowest rank first, every occurrence left to
right, which is what Hugging Face tokenizers' BPE model does with ignore_merges=false.
"""
import heapq
import json
import unicodedata

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()


def _cls(c):
    if c.isspace():
        return "S"
    cat = unicodedata.category(c)[0]
    return cat if cat in ("L", "N") else "P"


def pretokenize(text):
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            hit = next((s for s in CONTRACTIONS if text.startswith(s, i)), None)
            if hit:
                out.append(hit)
                i += len(hit)
                continue
        start = i
        k = i + 1 if c == " " and i + 1 < n and _cls(text[i + 1]) != "S" else i
        kind = _cls(text[k])
        if kind != "S":
            j = k + 1
            while j < n and _cls(text[j]) == kind:
                j += 1
            out.append(text[start:j])
            i = j
            continue
        j = i
        while j < n and text[j].isspace():
            j += 1
        if j < n and j - i > 1:
            j -= 1  # \s+(?!\S): leave the last whitespace character to the next token
        out.append(text[i:j])
        i = j
    return out


def _pairs(word):
    return zip(word, word[1:])


def train(word_counts, vocab_size, log=print):
    """word_counts: {pretoken string: count}. Returns merges as a list of (left id, right id)."""
    words = [list(w.encode("utf-8")) for w in word_counts]
    counts = list(word_counts.values())
    pair_count, where = {}, {}
    for idx, (w, c) in enumerate(zip(words, counts)):
        for p in _pairs(w):
            pair_count[p] = pair_count.get(p, 0) + c
            where.setdefault(p, set()).add(idx)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue  # stale heap entry
        new_id = 256 + len(merges)
        merges.append(pair)
        changed = set()
        for idx in sorted(where.pop(pair, ())):
            w, c = words[idx], counts[idx]
            if len(w) < 2:
                continue
            for p in _pairs(w):
                pair_count[p] -= c
                changed.add(p)
            merged, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    merged.append(new_id)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            words[idx] = merged
            for p in _pairs(merged):
                pair_count[p] = pair_count.get(p, 0) + c
                where.setdefault(p, set()).add(idx)
                changed.add(p)
        pair_count.pop(pair, None)
        for p in changed:
            if p != pair and pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
        if len(merges) % 500 == 0:
            log(f"bpe: {len(merges)}/{n_merges} merges")
    return merges


class Encoder:
    def __init__(self, merges):
        self.merges = merges
        self.ranks = {p: (r, 256 + r) for r, p in enumerate(merges)}
        self.token_bytes = [bytes([b]) for b in range(256)]
        for a, b in merges:
            self.token_bytes.append(self.token_bytes[a] + self.token_bytes[b])
        base = 256 + len(merges)
        self.special_ids = {s: base + i for i, s in enumerate(SPECIAL_TOKENS)}
        self.cache = {}

    @property
    def vocab_size(self):
        return 256 + len(self.merges) + len(SPECIAL_TOKENS)

    def _bpe(self, piece):
        w = list(piece.encode("utf-8"))
        while len(w) > 1:
            best = min(((self.ranks[p], i) for i, p in enumerate(_pairs(w)) if p in self.ranks), default=None)
            if best is None:
                break
            (rank, new_id), _ = best
            pair = self.merges[rank]
            merged, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    merged.append(new_id)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            w = merged
        return w

    def encode(self, text):
        """Plain text (no special tokens inside) to ids."""
        ids = []
        for piece in pretokenize(text):
            got = self.cache.get(piece)
            if got is None:
                got = self._bpe(piece)
                if len(self.cache) < 500000:
                    self.cache[piece] = got
            ids.extend(got)
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.special_ids.items()}
        out = b""
        for i in ids:
            out += inv[i].encode() if i in inv else self.token_bytes[i]
        return out.decode("utf-8", errors="replace")

    def token_string(self, i):
        return "".join(BYTE_TO_CHAR[b] for b in self.token_bytes[i])

    def tokenizer_json(self):
        vocab = {self.token_string(i): i for i in range(256 + len(self.merges))}
        added = []
        for s, i in self.special_ids.items():
            vocab[s] = i
            added.append({"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
        merges = [f"{self.token_string(a)} {self.token_string(b)}" for a, b in self.merges]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": byte_level,
            "post_processor": dict(byte_level, trim_offsets=False),
            "decoder": dict(byte_level),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges},
        }


def count_words(texts):
    counts = {}
    for t in texts:
        for piece in pretokenize(t):
            counts[piece] = counts.get(piece, 0) + 1
    return counts


def write_tokenizer_json(encoder, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(encoder.tokenizer_json(), f, ensure_ascii=False, indent=1)
