// The AI SDK 5 as its docs show it: createOpenAI({baseURL})(model) speaks the Responses API.
// generateText, streamText, a follow-up by previousResponseId and one by the returned messages
// (their assistant turn goes back as an item_reference to the stored response).
// Usage: node ai_sdk_client.mjs BASE_URL MODEL  (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { createOpenAI } = require(process.env.KVFLEET_NPM + "/node_modules/@ai-sdk/openai");
const { generateText, streamText } = require(process.env.KVFLEET_NPM + "/node_modules/ai");
const [baseURL, modelName] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "unused" });
const model = openai(modelName);
const settings = { model, system: "You are terse.", maxOutputTokens: 5, temperature: 0, maxRetries: 0 };

const generated = await generateText({ ...settings, prompt: "Hello!" });
assert.ok(generated.text.length > 0);
assert.equal(generated.finishReason, "length");
assert.equal(generated.usage.outputTokens, 5);
assert.match(generated.response.id, /^resp_/);

const streamed = streamText({ ...settings, prompt: "Hello!" });
assert.equal(await streamed.text, generated.text);
assert.equal(await streamed.finishReason, "length");
assert.equal((await streamed.usage).outputTokens, 5);

// The stored conversation already opens with the system message.
const byId = await generateText({ ...settings, system: undefined, prompt: "And then?",
                                  providerOptions: { openai: { previousResponseId: generated.response.id } } });
assert.ok(byId.usage.inputTokens > generated.usage.inputTokens + 5);

// The same conversation as messages: the assistant turn goes back as an item_reference.
const byMessages = await generateText({ ...settings,
  messages: [{ role: "user", content: "Hello!" }, ...generated.response.messages, { role: "user", content: "And then?" }] });
assert.equal(byMessages.usage.inputTokens, byId.usage.inputTokens);
console.log("ok");
