// Talks to a kvfleet replica with the official `openai` npm package and checks what comes back.
// Usage: node openai_client.mjs BASE_URL MODEL  (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const OpenAI = require(process.env.KVFLEET_NPM + "/node_modules/openai").default;
const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });

const models = await client.models.list();
assert.equal(models.data[0].id, model);

const completion = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 6, temperature: 0 });
assert.equal(completion.object, "text_completion");
assert.equal(typeof completion.choices[0].text, "string");
assert.equal(completion.choices[0].finish_reason, "length");
assert.equal(completion.usage.completion_tokens, 6);
assert.equal(completion.usage.total_tokens, completion.usage.prompt_tokens + 6);

const chat = await client.chat.completions.create({
  model, messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Hello!" }],
  max_tokens: 5, temperature: 0,
});
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(chat.usage.completion_tokens, 5);

// Streaming gives the same text as the whole response (greedy), then usage.
const stream = await client.chat.completions.create({
  model, messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Hello!" }],
  max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = "", usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    text += c.delta.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.equal(text, chat.choices[0].message.content);
assert.equal(finish, "length");
assert.equal(usage.completion_tokens, 5);

const cstream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 6, temperature: 0, stream: true });
let ctext = "";
for await (const chunk of cstream) ctext += chunk.choices[0]?.text ?? "";
assert.equal(ctext, completion.choices[0].text);

// Errors arrive as OpenAI errors.
await assert.rejects(client.completions.create({ model, prompt: "x", temperature: 7 }), (e) => e.status === 400 && e.error?.param === "temperature");
await assert.rejects(client.completions.create({ model: "no-such-model", prompt: "x" }), (e) => e.status === 404);
console.log("ok");
