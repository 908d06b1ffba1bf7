// Tool calls through the official `openai` npm package: a replica with --tool-call-parser hermes and a model
// whose token CALL_TOKEN decodes to a hermes call and TWO_CALLS_TOKEN to two (tests/server/tool_model.h).
// Usage: node openai_tools_client.mjs BASE_URL CALL_TOKEN TWO_CALLS_TOKEN  (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const OpenAI = require(process.env.KVFLEET_NPM + "/node_modules/openai").default;
const [baseURL, callToken, twoCallsToken] = process.argv.slice(2);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });
const tools = [{ type: "function", function: { name: "get_weather", parameters: { type: "object",
  properties: { city: { type: "string" } }, required: ["city"] } } }];
const request = { model: "", messages: [{ role: "user", content: "Weather in Paris?" }], tools, tool_choice: "auto",
  temperature: 0, max_tokens: 1, logit_bias: { [callToken]: 100 } };

const whole = await client.chat.completions.create(request);
assert.equal(whole.choices[0].finish_reason, "tool_calls");
const call = whole.choices[0].message.tool_calls[0];
assert.equal(call.function.name, "get_weather");
assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" });

// The client's stream helper assembles the deltas into the same message.
const runner = client.beta.chat.completions.stream({ ...request, stream: true });
const final = await runner.finalChatCompletion();
const streamed = final.choices[0].message.tool_calls[0];
assert.equal(final.choices[0].finish_reason, "tool_calls");
assert.equal(streamed.function.name, "get_weather");
assert.ok(streamed.id.startsWith("call_"));
assert.deepEqual(JSON.parse(streamed.function.arguments), { city: "Paris" });

// Two calls in one turn (parallel_tool_calls true), whole and joined from the stream's deltas by index.
const two = { ...request, tools: [...tools, { type: "function", function: { name: "get_time", parameters: { type: "object",
  properties: { zone: { type: "string" } } } } }], logit_bias: { [twoCallsToken]: 100 }, parallel_tool_calls: true };
const wantTwo = [["get_weather", { city: "Paris" }], ["get_time", { zone: "CET" }]];
const named = (calls) => calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]);
const parallel = await client.chat.completions.create(two);
assert.deepEqual(named(parallel.choices[0].message.tool_calls), wantTwo);
const parallelStreamed = await client.beta.chat.completions.stream({ ...two, stream: true }).finalChatCompletion();
assert.deepEqual(named(parallelStreamed.choices[0].message.tool_calls), wantTwo);
assert.equal(new Set(parallelStreamed.choices[0].message.tool_calls.map((c) => c.id)).size, 2);

// Multi-turn: the call and its result go back; the answer is a plain 200.
const next = await client.chat.completions.create({ ...request, logit_bias: undefined, max_tokens: 2, messages: [
  ...request.messages, whole.choices[0].message, { role: "tool", tool_call_id: call.id, content: "sunny" }] });
assert.equal(next.choices[0].message.role, "assistant");
console.log("ok");
