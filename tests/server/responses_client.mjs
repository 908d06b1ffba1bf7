// The Responses API with the official `openai` npm package: plain, streamed, a stored follow-up with
// previous_response_id, retrieve, delete, and errors as OpenAI errors.
// Usage: node responses_client.mjs BASE_URL MODEL  (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const OpenAI = require(process.env.KVFLEET_NPM + "/node_modules/openai").default;
const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });
const request = { model, instructions: "You are terse.", input: "Hello!", max_output_tokens: 5, temperature: 0 };

const plain = await client.responses.create(request);
assert.match(plain.id, /^resp_/);
assert.equal(plain.object, "response");
assert.ok(Math.abs(plain.created_at - Date.now() / 1000) < 120, "created_at is the request's time");
assert.equal(plain.model, model);
assert.equal(plain.status, "incomplete");
assert.equal(plain.incomplete_details.reason, "max_output_tokens");
assert.equal(plain.instructions, "You are terse.");
assert.equal(plain.max_output_tokens, 5);
assert.equal(plain.store, true);
assert.equal(plain.output.length, 1);
assert.equal(plain.output[0].type, "message");
assert.equal(plain.output[0].role, "assistant");
assert.match(plain.output[0].id, /^msg_/);
assert.equal(plain.output[0].content[0].type, "output_text");
assert.ok(plain.output_text.length > 0);
assert.equal(plain.output_text, plain.output[0].content[0].text);
assert.equal(plain.usage.output_tokens, 5);
assert.equal(plain.usage.total_tokens, plain.usage.input_tokens + 5);

// Streamed: the same text (greedy), typed events numbered from 0, ending with response.incomplete.
const events = [];
for await (const e of await client.responses.create({ ...request, stream: true })) events.push(e);
assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
assert.deepEqual(events.slice(0, 4).map((e) => e.type),
  ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]);
assert.deepEqual(events.slice(-4).map((e) => e.type),
  ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]);
const deltas = events.filter((e) => e.type === "response.output_text.delta");
assert.equal(deltas.map((e) => e.delta).join(""), plain.output_text);
const last = events.at(-1).response;
assert.equal(last.usage.output_tokens, 5);
assert.equal(last.output[0].content[0].text, plain.output_text);

// The SDK's stream helper accumulates the same response.
const helper = client.responses.stream({ ...request });
const final = await helper.finalResponse();
assert.equal(final.output[0].content[0].text, plain.output_text);

// Stored: retrieve it, continue from it, delete it.
const got = await client.responses.retrieve(plain.id);
assert.equal(got.id, plain.id);
assert.equal(got.output[0].content[0].text, plain.output_text);
const follow = await client.responses.create({ model, input: "And then?", previous_response_id: plain.id,
                                               max_output_tokens: 3, temperature: 0 });
assert.equal(follow.previous_response_id, plain.id);
// The follow-up's prompt holds the first turn (its input and output) and the new input.
assert.ok(follow.usage.input_tokens > plain.usage.input_tokens + 5, `${follow.usage.input_tokens}`);
const streamedFollow = [];
for await (const e of await client.responses.create({ model, input: "And then?", previous_response_id: plain.id,
                                                     max_output_tokens: 3, temperature: 0, stream: true }))
  streamedFollow.push(e);
assert.equal(streamedFollow.at(-1).response.output[0].content[0].text, follow.output_text);
const deleted = await client.responses.del(plain.id);
assert.deepEqual(deleted, { id: plain.id, object: "response.deleted", deleted: true });
await assert.rejects(client.responses.retrieve(plain.id), (e) => e.status === 404);
await assert.rejects(client.responses.create({ model, input: "x", previous_response_id: plain.id }),
                     (e) => e.status === 400 && e.error?.param === "previous_response_id");

// store: false is not kept.
const unstored = await client.responses.create({ ...request, store: false });
assert.equal(unstored.store, false);
await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);

// Errors are OpenAI errors naming the field.
await assert.rejects(client.responses.create({ model, input: "x", temperature: 7 }),
                     (e) => e.status === 400 && e.error?.param === "temperature");
await assert.rejects(client.responses.create({ model, input: "x", tools: [{ type: "web_search_preview" }] }),
                     (e) => e.status === 400 && e.error?.param === "tools[0].type");
await assert.rejects(client.responses.create({ model: "no-such-model", input: "x" }), (e) => e.status === 404);
console.log("ok");
