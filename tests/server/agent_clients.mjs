// Tool calls the model chooses to make (tool_choice "auto", or none sent), through the AI SDK 5 and LangChain
// JS as agents use them, each over chat completions and /v1/responses: whole and streamed, two calls in one
// turn, and the second turn with the tool's result (the AI SDK's step loop, LangChain's ToolMessage).
// The replica runs --tool-call-parser hermes --enable-auto-tool-choice on a model whose CALL_TOKEN
// decodes to one hermes call (get_weather {"city":"Paris"}), TWO_CALLS_TOKEN to two (the second get_time
// {"zone":"CET"}), ANSWER_TOKEN to a plain answer and TEXT_CALL_TOKEN to TEXT_BEFORE_CALL, a space and the
// call of CALL_TOKEN (tests/server/tool_model.h); a logit bias on the token makes the model write it (the
// clients' own logitBias option over chat completions; over /v1/responses, where they have none, the
// recording fetch adds it).
// With --reasoning-parser qwen3 on the replica, THINK_TOKEN decodes to <think>THINK_REASONING</think>THINK_ANSWER:
// the AI SDK over /v1/responses reads the reasoning item as reasoningText, and sends it back in the next turn.
// Every request body a client sends is recorded, so that each check also shows what the client asked for.
// Usage: node agent_clients.mjs BASE_URL MODEL CALL_TOKEN TWO_CALLS_TOKEN ANSWER_TOKEN ANSWER_TEXT TEXT_CALL_TOKEN
//                               TEXT_BEFORE_CALL THINK_TOKEN THINK_REASONING THINK_ANSWER (JSON strings)
//        (exit 0 and "ok" when every check passes)
import assert from "node:assert/strict";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const npm = process.env.KVFLEET_NPM + "/node_modules/";
const { createOpenAI } = require(npm + "@ai-sdk/openai");
const { generateText, streamText, tool, stepCountIs } = require(npm + "ai");
const { z } = require(npm + "zod");
const { ChatOpenAI } = require(npm + "@langchain/openai");
const { HumanMessage, ToolMessage } = require(npm + "@langchain/core/messages");
const [baseURL, model, callToken, twoCallsToken, answerToken, answerText, textCallToken, textBeforeCall, thinkToken] =
  process.argv.slice(2);
const [thinkReasoning, thinkAnswer] = process.argv.slice(11).map((s) => JSON.parse(s));

const weather = { name: "get_weather", input: { city: "Paris" } };
const time = { name: "get_time", input: { zone: "CET" } };
const prompt = "Weather in Paris?";

// A fetch that records each request's JSON body and adds `extra` to it (a field a client has no option for).
const sent = [];
const recording = (extra = {}) => async (url, init) => {
  const body = { ...JSON.parse(init.body), ...extra };
  sent.push({ url: String(url), body });
  return fetch(url, { ...init, body: JSON.stringify(body) });
};
const last = (path) => {
  const s = sent.at(-1);
  assert.ok(s.url.endsWith(path), s.url);
  return s.body;
};
function sameCalls(got, want, what) {
  assert.deepEqual(got.map((c) => ({ name: c.name, input: c.input })), want, what);
  for (const c of got) assert.ok(c.id, `${what}: a call without an id`);
  assert.equal(new Set(got.map((c) => c.id)).size, got.length, `${what}: ids repeat`);
}

// --- AI SDK 5: generateText and streamText with tools and no toolChoice (it sends "auto") ---
const sdkTools = {
  get_weather: tool({ description: "Weather forecast", inputSchema: z.object({ city: z.string() }) }),
  get_time: tool({ description: "The time in a zone", inputSchema: z.object({ zone: z.string() }) }),
};
const bias = (token) => ({ [token]: 100 });
const sdkCalls = (calls) => calls.map((c) => ({ id: c.toolCallId, name: c.toolName, input: c.input }));
const sdkCounts = (u) => [u.inputTokens, u.outputTokens];

// Over chat completions (provider.chat) the bias is the provider's logitBias option; over /v1/responses,
// which has no such option, the recording fetch adds it (a vLLM extra the Responses endpoint takes).
const chatProvider = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", fetch: recording() });
const sdkChat = (token, parallel) => ({
  model: chatProvider.chat(model), path: "/chat/completions",
  providerOptions: { openai: { logitBias: bias(token), parallelToolCalls: parallel } },
});
const sdkResponses = (token, parallel) => ({
  model: createOpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", fetch: recording({ logit_bias: bias(token) }) })(model),
  path: "/responses", providerOptions: { openai: { parallelToolCalls: parallel } },
});

for (const via of [sdkChat, sdkResponses]) {
  for (const [token, want] of [[callToken, [weather]], [twoCallsToken, [weather, time]]]) {
    const what = `AI SDK ${via === sdkChat ? "chat" : "responses"}, ${want.length} call(s)`;
    const { model: m, path, providerOptions } = via(token, true);
    const common = { model: m, providerOptions, tools: sdkTools, prompt, temperature: 0, maxOutputTokens: 1, maxRetries: 0 };

    const whole = await generateText(common);
    assert.equal(last(path).tool_choice, "auto", what);
    assert.equal(whole.finishReason, "tool-calls", what);
    sameCalls(sdkCalls(whole.toolCalls), want, what);
    assert.equal(whole.usage.outputTokens, 1, what);

    // streamText: the provider assembles the calls from the stream's deltas.
    const stream = streamText(common);
    const parts = [];
    for await (const part of stream.fullStream) parts.push(part);
    assert.equal(last(path).stream, true, what);
    const errors = parts.filter((p) => p.type === "error");
    assert.deepEqual(errors, [], what);
    assert.equal(await stream.finishReason, "tool-calls", what);
    assert.deepEqual(sdkCounts(await stream.usage), sdkCounts(whole.usage), what);
    sameCalls(sdkCalls(await stream.toolCalls), want, what + ", streamed");
    sameCalls(sdkCalls(parts.filter((p) => p.type === "tool-call")), want, what + ", stream parts");
    const inputs = {};
    for (const p of parts.filter((p) => p.type === "tool-input-delta")) inputs[p.id] = (inputs[p.id] ?? "") + p.delta;
    assert.deepEqual(Object.values(inputs).map((s) => JSON.parse(s)), want.map((c) => c.input), what + ", input deltas");
  }
  // Text and then a call in one answer: the text as text (up to the call's markup), the call as a call.
  {
    const what = `AI SDK ${via === sdkChat ? "chat" : "responses"}, text and a call`;
    const { model: m, providerOptions } = via(textCallToken, true);
    const common = { model: m, providerOptions, tools: sdkTools, prompt, temperature: 0, maxOutputTokens: 1, maxRetries: 0 };
    const whole = await generateText(common);
    assert.equal(whole.text.trim(), textBeforeCall, what);
    assert.equal(whole.finishReason, "tool-calls", what);
    sameCalls(sdkCalls(whole.toolCalls), [weather], what);
    const stream = streamText(common);
    const kinds = [];
    for await (const part of stream.fullStream) kinds.push(part.type);
    assert.equal(await stream.text, whole.text, what);
    sameCalls(sdkCalls(await stream.toolCalls), [weather], what + ", streamed");
    assert.ok(kinds.lastIndexOf("text-delta") < kinds.indexOf("tool-call"), `${what}: ${kinds}`);
  }

  // The agent loop: the tool runs, its result goes back (a tool message over chat, a function_call_output
  // item over /v1/responses) and the second step answers. Each step's model sends its own bias.
  const biased = (token) => {
    const p = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", fetch: recording({ logit_bias: bias(token) }) });
    return via === sdkChat ? p.chat(model) : p(model);
  };
  let ran = 0;
  const loop = await generateText({ model: biased(callToken), prompt, temperature: 0, maxOutputTokens: 1, maxRetries: 0,
    tools: { ...sdkTools, get_weather: tool({ ...sdkTools.get_weather, execute: async ({ city }) => (ran++, `sunny in ${city}`) }) },
    stopWhen: stepCountIs(3), prepareStep: ({ stepNumber }) => (stepNumber === 0 ? {} : { model: biased(answerToken) }) });
  assert.equal(ran, 1);
  assert.equal(loop.steps.length, 2);
  assert.equal(loop.text, answerText);
  assert.equal(loop.finishReason, "length");
  assert.ok(loop.steps[1].usage.inputTokens > loop.steps[0].usage.inputTokens);
  const callId = loop.steps[0].toolCalls[0].toolCallId;
  const back = JSON.stringify(via === sdkChat ? last("/chat/completions").messages : last("/responses").input);
  assert.ok(back.includes(callId) && back.includes("sunny in Paris"), back);

  // parallel_tool_calls false: the first of the model's two calls.
  const { model: m, path, providerOptions } = via(twoCallsToken, false);
  const one = await generateText({ model: m, providerOptions, tools: sdkTools, prompt, temperature: 0, maxOutputTokens: 1, maxRetries: 0 });
  assert.equal(last(path).parallel_tool_calls, false);
  sameCalls(sdkCalls(one.toolCalls), [weather], "AI SDK, parallel_tool_calls false");
}

// --- AI SDK 5 over /v1/responses with reasoning: reasoningText whole and streamed, and the next turn ---
{
  const thinking = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "unused",
                                  fetch: recording({ logit_bias: bias(thinkToken) }) })(model);
  const common = { model: thinking, temperature: 0, maxOutputTokens: 1, maxRetries: 0 };
  const whole = await generateText({ ...common, prompt });
  assert.equal(whole.reasoningText, thinkReasoning, "AI SDK responses, reasoningText");
  assert.equal(whole.text, thinkAnswer, "AI SDK responses, text after the reasoning");

  const stream = streamText({ ...common, prompt });
  const parts = [];
  for await (const part of stream.fullStream) parts.push(part);
  assert.deepEqual(parts.filter((p) => p.type === "error"), [], "AI SDK responses, reasoning streamed");
  assert.equal(await stream.reasoningText, thinkReasoning, "AI SDK responses, reasoningText streamed");
  assert.equal(await stream.text, thinkAnswer, "AI SDK responses, text streamed");
  const kinds = parts.map((p) => p.type);
  assert.ok(kinds.lastIndexOf("reasoning-delta") < kinds.indexOf("text-delta"), `reasoning before text: ${kinds}`);

  // The next turn carries the first answer back: the stored reasoning and message items by reference.
  const next = await generateText({ ...common, messages: [{ role: "user", content: prompt }, ...whole.response.messages,
                                                          { role: "user", content: "And tomorrow?" }] });
  const input = last("/responses").input;
  assert.ok(input.some((i) => i.type === "item_reference" && i.id.startsWith("rs_")), JSON.stringify(input));
  assert.equal(next.reasoningText, thinkReasoning, "AI SDK responses, second turn");
  assert.ok(next.usage.inputTokens > whole.usage.inputTokens, `${next.usage.inputTokens} <= ${whole.usage.inputTokens}`);
}

// --- LangChain JS: bindTools without a tool_choice, over chat completions and (useResponsesApi) /v1/responses ---
const lcTools = [{ name: "get_weather", description: "Weather forecast", schema: z.object({ city: z.string() }) },
                 { name: "get_time", description: "The time in a zone", schema: z.object({ zone: z.string() }) }];
const lcCalls = (calls) => calls.map((c) => ({ id: c.id, name: c.name, input: c.args }));
const counts = (u) => [u.input_tokens, u.output_tokens];

async function langchain(responses) {
  // Over /v1/responses LangChain sends no logit bias: the recording fetch adds it.
  const lc = (token) => new ChatOpenAI({ model, apiKey: "unused", temperature: 0, maxTokens: 1, maxRetries: 0,
    logitBias: bias(token), useResponsesApi: responses,
    configuration: { baseURL: baseURL + "/v1", fetch: recording(responses ? { logit_bias: bias(token) } : {}) } });
  const path = responses ? "/responses" : "/chat/completions";
  const finished = (m, reason) => {
    if (responses) assert.equal(m.response_metadata.status, reason === "length" ? "incomplete" : "completed");
    else assert.equal(m.response_metadata.finish_reason, reason);
  };

  for (const [token, want] of [[callToken, [weather]], [twoCallsToken, [weather, time]]]) {
    const what = `LangChain ${path}, ${want.length} call(s)`;
    const ai = await lc(token).bindTools(lcTools).invoke(prompt);
    const body = last(path);
    assert.equal(body.tool_choice, undefined, what);
    assert.deepEqual(body.tools.map((t) => (responses ? t : t.function).name), ["get_weather", "get_time"], what);
    finished(ai, "tool_calls");
    sameCalls(lcCalls(ai.tool_calls), want, what);

    // stream: chunks carry tool_call_chunks by index; concatenated, they are the calls.
    let whole;
    const indices = new Set();
    for await (const chunk of await lc(token).bindTools(lcTools).stream(prompt)) {
      for (const c of chunk.tool_call_chunks ?? []) indices.add(c.index);
      whole = whole ? whole.concat(chunk) : chunk;
    }
    assert.equal(last(path).stream, true, what);
    assert.equal(indices.size, want.length, what + ", chunk indices");
    finished(whole, "tool_calls");
    assert.deepEqual(counts(whole.usage_metadata), counts(ai.usage_metadata), what);
    assert.deepEqual(whole.invalid_tool_calls, [], what);
    sameCalls(lcCalls(whole.tool_calls), want, what + ", streamed");
  }
  // Text and then a call: the AIMessage's text and its call, whole and streamed.
  const said = await lc(textCallToken).bindTools(lcTools).invoke(prompt);
  assert.equal(said.text.trim(), textBeforeCall);
  sameCalls(lcCalls(said.tool_calls), [weather], `LangChain ${path}, text and a call`);
  let saidStreamed;
  for await (const chunk of await lc(textCallToken).bindTools(lcTools).stream(prompt))
    saidStreamed = saidStreamed ? saidStreamed.concat(chunk) : chunk;
  assert.equal(saidStreamed.text, said.text);
  sameCalls(lcCalls(saidStreamed.tool_calls), [weather], `LangChain ${path}, text and a call, streamed`);

  const twoParallel = await lc(twoCallsToken).bindTools(lcTools, { parallel_tool_calls: true }).invoke(prompt);
  assert.equal(last(path).parallel_tool_calls, true);
  sameCalls(lcCalls(twoParallel.tool_calls), [weather, time], `LangChain ${path}, parallel_tool_calls true`);

  // Multi-turn: the AIMessage with its call and the ToolMessage go back; the template renders the result into
  // the prompt (a longer result, a longer prompt) and the model answers (ANSWER_TOKEN, one token: "length").
  const first = await lc(callToken).bindTools(lcTools).invoke([new HumanMessage(prompt)]);
  const callId = first.tool_calls[0].id;
  const turn = async (result) => {
    const r = await lc(answerToken).bindTools(lcTools).invoke([new HumanMessage(prompt), first,
      new ToolMessage({ tool_call_id: callId, content: result })]);
    const sent = last(path);
    if (responses) {
      assert.deepEqual(sent.input.map((i) => i.type), ["message", "function_call", "function_call_output"]);
      assert.deepEqual([sent.input[1].call_id, sent.input[2].call_id, sent.input[2].output], [callId, callId, result]);
    } else {
      assert.deepEqual(sent.messages.map((m) => m.role), ["user", "assistant", "tool"]);
      assert.deepEqual([sent.messages[1].tool_calls[0].id, sent.messages[2].tool_call_id], [callId, callId]);
    }
    return r;
  };
  const second = await turn("sunny");
  assert.equal(second.text, answerText);
  assert.deepEqual(second.tool_calls, []);
  finished(second, "length");
  assert.equal(second.usage_metadata.output_tokens, 1);
  assert.ok(second.usage_metadata.input_tokens > first.usage_metadata.input_tokens,
            `${second.usage_metadata.input_tokens} <= ${first.usage_metadata.input_tokens}`);
  const longer = await turn("sunny, 25 degrees at noon, a light wind from the west and no rain until Friday");
  assert.ok(longer.usage_metadata.input_tokens > second.usage_metadata.input_tokens + 10,
            `${longer.usage_metadata.input_tokens} vs ${second.usage_metadata.input_tokens}`);
}
await langchain(false);
await langchain(true);
console.log("ok");
