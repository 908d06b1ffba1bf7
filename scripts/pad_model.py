#!/usr/bin/env python3
"""Makes a deeper copy of a float32 Llama checkpoint for draft-model benchmarks: a target that costs more per
token than the model it was made from, whose outputs the original (used as the draft) predicts to a chosen
degree.

  scripts/pad_model.py SRC OUT --layers N [--scale S]

OUT has N layers: SRC's, then copies of SRC's layers (layer i copies layer i % L) whose attention output
(o_proj) and MLP output (down_proj) are multiplied by S. S = 0 (the default): the extra layers add nothing to
the residual stream, so OUT computes SRC's function at N / L times its layer cost (a draft that is always
right); S > 0 perturbs it (drafts partly right). Tokenizer and generation files are copied unchanged."""
import argparse
import array
import json
import shutil
import struct
import sys
from pathlib import Path


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--scale", type=float, default=0.0)
    a = ap.parse_args()
    src, out = Path(a.src), Path(a.out)
    config = json.loads((src / "config.json").read_text())
    base = config["num_hidden_layers"]
    if a.layers < base:
        sys.exit(f"--layers must be at least the source's {base}")
    header, data = read(src / "model.safetensors")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{name}: only float32 checkpoints are supported")
        begin, end = info["data_offsets"]
        tensors[name] = (info["shape"], data[begin:end])
    for i in range(base, a.layers):
        prefix = f"model.layers.{i % base}."
        for name, (shape, raw) in list(tensors.items()):
            if not name.startswith(prefix):
                continue
            new = f"model.layers.{i}." + name[len(prefix):]
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                values = array.array("f", raw)
                for j in range(len(values)):
                    values[j] *= a.scale
                raw = values.tobytes()
            tensors[new] = (shape, raw)
    out.mkdir(parents=True, exist_ok=True)
    meta, blob, offset = {"__metadata__": {"format": "pt"}}, bytearray(), 0
    for name in sorted(tensors):
        shape, raw = tensors[name]
        meta[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blob += raw
        offset += len(raw)
    head = json.dumps(meta).encode()
    head += b" " * (-len(head) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        f.write(blob)
    config["num_hidden_layers"] = a.layers
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)


if __name__ == "__main__":
    main()
