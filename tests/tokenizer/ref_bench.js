// Times the JS reference encoder for bench/tokenize.cpp.
//   node tests/tokenizer/ref_bench.js MODEL TEXT_FILE
// Encodes the file line by line (as the C++ side does), once to warm up and once timed; prints
// {"bytes": N, "seconds": S, "tokens": T}.
"use strict";
const fs = require("fs");
const { loadEncoder } = require("./ref_common.js");

const [model, file] = process.argv.slice(2);
const encode = loadEncoder(model, false);
const lines = fs.readFileSync(file, "utf8").split("\n");
const bytes = Buffer.byteLength(lines.join("\n"), "utf8");
let tokens = 0;
for (const line of lines) encode(line);
const start = process.hrtime.bigint();
for (const line of lines) tokens += encode(line).length;
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
process.stdout.write(JSON.stringify({ bytes, seconds, tokens }));
