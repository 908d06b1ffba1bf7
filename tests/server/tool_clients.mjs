// Tool calls and structured outputs through the clients people use, against a replica (or a router) serving
// the committed default model: the openai package (tool_choice required and named, whole and streamed,
// response_format json_schema and json_object, structured_outputs choice (whole and streamed) and regex,
// guided_choice), the AI SDK 5 (generateText with a tool over /v1/responses and over chat
// completions, streamText, the tool's result sent back, generateObject with a zod schema) and LangChain JS
// (bindTools, stream, withStructuredOutput). Every call's arguments and every object are validated with ajv
// against the schema.
// Usage: node tool_clients.mjs BASE_URL MODEL  (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const npm = process.env.KVFLEET_NPM + "/node_modules/";
const OpenAI = require(npm + "openai").default;
const { createOpenAI } = require(npm + "@ai-sdk/openai");
const { generateText, generateObject, streamText, tool, stepCountIs } = require(npm + "ai");
const { z } = require(npm + "zod");
const Ajv = require(npm + "ajv").default;
const { ChatOpenAI } = require(npm + "@langchain/openai");
const [baseURL, model] = process.argv.slice(2);

// Bounded values (enums, bounded integers): any model ends its constrained answer within the token budget.
const weatherSchema = { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome", "Oslo"] },
  days: { type: "integer", minimum: 1, maximum: 7 } }, required: ["city", "days"], additionalProperties: false };
const timeSchema = { type: "object", properties: { zone: { type: "string", enum: ["CET", "UTC"] } },
  required: ["zone"], additionalProperties: false };
const weatherZod = z.object({ city: z.enum(["Paris", "Rome", "Oslo"]), days: z.number().int().min(1).max(7) });
const timeZod = z.object({ zone: z.enum(["CET", "UTC"]) });
const ajv = new Ajv({ strict: false });
const validators = { get_weather: ajv.compile(weatherSchema), get_time: ajv.compile(timeSchema) };
function valid(name, args) {
  const v = validators[name];
  assert.ok(v, `unknown tool ${name}`);
  assert.ok(v(args), `${name} ${JSON.stringify(args)}: ${ajv.errorsText(v.errors)}`);
}

// --- openai ---
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather forecast", parameters: weatherSchema } },
               { type: "function", function: { name: "get_time", parameters: timeSchema } }];
const request = { model, messages: [{ role: "user", content: "Weather in Paris for 3 days?" }], tools, max_tokens: 80,
                  temperature: 0 };
// parallel_tool_calls false: this tiny model, free to list more calls, would list them until max_tokens.
const required = await client.chat.completions.create({ ...request, tool_choice: "required", parallel_tool_calls: false });
assert.equal(required.choices[0].finish_reason, "tool_calls");
assert.ok(required.choices[0].message.tool_calls.length >= 1);
for (const c of required.choices[0].message.tool_calls) valid(c.function.name, JSON.parse(c.function.arguments));

const namedChoice = { type: "function", function: { name: "get_time" } };
const named = await client.chat.completions.create({ ...request, tool_choice: namedChoice });
assert.equal(named.choices[0].message.tool_calls.length, 1);
assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_time");
valid("get_time", JSON.parse(named.choices[0].message.tool_calls[0].function.arguments));

const runner = client.beta.chat.completions.stream({ ...request, tool_choice: namedChoice, stream: true });
const final = await runner.finalChatCompletion();
assert.equal(final.choices[0].finish_reason, "tool_calls");
const streamedCall = final.choices[0].message.tool_calls[0];
assert.ok(streamedCall.id.startsWith("call_"));
assert.equal(streamedCall.function.name, "get_time");
assert.equal(streamedCall.function.arguments, named.choices[0].message.tool_calls[0].function.arguments);

const multi = await client.chat.completions.create({ ...request, tool_choice: "none", max_tokens: 3, messages: [
  ...request.messages, named.choices[0].message,
  { role: "tool", tool_call_id: named.choices[0].message.tool_calls[0].id, content: "12:00" }] });
assert.equal(multi.choices[0].message.role, "assistant");

// (response_format allows runs of whitespace between tokens, which this tiny model likes: more tokens.)
const structured = await client.chat.completions.create({ ...request, tools: undefined, max_tokens: 400,
  response_format: { type: "json_schema", json_schema: { name: "weather", strict: true, schema: weatherSchema } } });
valid("get_weather", JSON.parse(structured.choices[0].message.content));

// vLLM's structured_outputs (the openai client sends body fields it does not know as they are) and
// response_format json_object; each output validated with ajv.
function conforms(schema, value) {
  const v = ajv.compile(schema);
  assert.ok(v(value), `${JSON.stringify(value)}: ${ajv.errorsText(v.errors)}`);
}
const plain = { ...request, tools: undefined };
const choices = ["yes", "no", "maybe"];
const choice = await client.chat.completions.create({ ...plain, structured_outputs: { choice: choices } });
conforms({ enum: choices }, choice.choices[0].message.content);
let streamedChoice = "";
for await (const chunk of await client.chat.completions.create({ ...plain, structured_outputs: { choice: choices }, stream: true })) {
  streamedChoice += chunk.choices[0]?.delta?.content ?? "";
}
assert.equal(streamedChoice, choice.choices[0].message.content);
const regex = await client.chat.completions.create({ ...plain, structured_outputs: { regex: "[0-9]{3}-[a-z]{2}" } });
conforms({ type: "string", pattern: "^[0-9]{3}-[a-z]{2}$" }, regex.choices[0].message.content);
const legacy = await client.chat.completions.create({ ...plain, guided_choice: choices });
conforms({ enum: choices }, legacy.choices[0].message.content);
// A free object's strings would run to max_tokens on this tiny model: a bias on "}" (id 125 in the default
// model's vocabulary) closes the object as soon as the grammar allows it.
const object = await client.chat.completions.create({ ...plain, max_tokens: 400, logit_bias: { 125: 100 },
  response_format: { type: "json_object" } });
assert.equal(object.choices[0].finish_reason, "stop", object.choices[0].message.content);
conforms({ type: "object" }, JSON.parse(object.choices[0].message.content));

// --- AI SDK 5 ---
const provider = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "unused" });
const sdkTools = (execute) => ({
  get_weather: tool({ description: "Weather forecast", inputSchema: weatherZod, execute }),
  get_time: tool({ inputSchema: timeZod, execute }),
});
const sdk = { maxOutputTokens: 80, temperature: 0, maxRetries: 0, prompt: "Weather in Paris for 3 days?",
              providerOptions: { openai: { parallelToolCalls: false } } };
for (const m of [provider(model), provider.chat(model)]) {  // /v1/responses, then /v1/chat/completions
  const r = await generateText({ ...sdk, model: m, tools: sdkTools(), toolChoice: "required" });
  assert.equal(r.finishReason, "tool-calls");
  assert.ok(r.toolCalls.length >= 1);
  for (const c of r.toolCalls) valid(c.toolName, c.input);
  const n = await generateText({ ...sdk, model: m, tools: sdkTools(), toolChoice: { type: "tool", toolName: "get_weather" } });
  assert.equal(n.toolCalls.length, 1);
  assert.equal(n.toolCalls[0].toolName, "get_weather");
  valid("get_weather", n.toolCalls[0].input);
  // streamText: the arguments arrive over many deltas; the provider joins them into the same call (greedy).
  const streamed = streamText({ ...sdk, model: m, tools: sdkTools(), toolChoice: { type: "tool", toolName: "get_weather" } });
  const parts = [];
  for await (const part of streamed.fullStream) parts.push(part);
  assert.deepEqual(parts.filter((p) => p.type === "error"), []);
  assert.ok(parts.filter((p) => p.type === "tool-input-delta").length > 1);
  assert.equal(await streamed.finishReason, "tool-calls");
  const [joined] = await streamed.toolCalls;
  assert.equal(joined.toolName, "get_weather");
  assert.deepEqual(joined.input, n.toolCalls[0].input);
  // The tool runs and its result goes back: a second step, whose request carries the call and its output.
  let ran = 0;
  const steps = await generateText({ ...sdk, model: m, tools: sdkTools(async () => { ran++; return "sunny"; }),
    stopWhen: stepCountIs(2), prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }) });
  assert.equal(steps.steps.length, 2);
  assert.ok(ran >= 1);
  assert.ok(steps.steps[1].usage.inputTokens > steps.steps[0].usage.inputTokens);
  const o = await generateObject({ ...sdk, maxOutputTokens: 400, model: m, schema: weatherZod });
  valid("get_weather", o.object);
}

// --- LangChain JS ---
const lcFields = { model, apiKey: "unused", temperature: 0, maxTokens: 80, maxRetries: 0,
                   configuration: { baseURL: baseURL + "/v1" } };
const chat = new ChatOpenAI(lcFields);
const lcTools = [{ name: "get_weather", description: "Weather forecast", schema: weatherZod },
                 { name: "get_time", description: "The time in a zone", schema: timeZod }];
for (const choice of ["required", "get_time"]) {
  const ai = await chat.bindTools(lcTools, { tool_choice: choice, parallel_tool_calls: false }).invoke("Weather in Paris for 3 days?");
  assert.ok(ai.tool_calls.length >= 1);
  if (choice !== "required") assert.equal(ai.tool_calls[0].name, choice);
  for (const c of ai.tool_calls) valid(c.name, c.args);
}
// stream: the named call's arguments over many chunks; concatenated, the call invoke() returns (greedy).
const lcNamed = chat.bindTools(lcTools, { tool_choice: "get_weather" });
const lcWhole = await lcNamed.invoke("Weather in Paris for 3 days?");
let lcJoined, argChunks = 0;
for await (const chunk of await lcNamed.stream("Weather in Paris for 3 days?")) {
  argChunks += (chunk.tool_call_chunks ?? []).filter((c) => c.args).length;
  lcJoined = lcJoined ? lcJoined.concat(chunk) : chunk;
}
assert.ok(argChunks > 1);
assert.equal(lcJoined.response_metadata.finish_reason, "tool_calls");
assert.deepEqual(lcJoined.invalid_tool_calls, []);
assert.equal(lcJoined.tool_calls.length, 1);
assert.equal(lcJoined.tool_calls[0].name, "get_weather");
assert.deepEqual(lcJoined.tool_calls[0].args, lcWhole.tool_calls[0].args);
valid("get_weather", lcJoined.tool_calls[0].args);
for (const method of ["jsonSchema", "functionCalling"]) {  // response_format json_schema; a named tool
  const out = await new ChatOpenAI({ ...lcFields, maxTokens: 400 }).withStructuredOutput(weatherZod, { method, name: "get_weather" }).invoke("Weather in Paris?");
  valid("get_weather", out);
}
console.log("ok");
