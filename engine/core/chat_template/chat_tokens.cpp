#include "kvfleet/chat_tokens.h"

#include <boost/json.hpp>

namespace kvfleet {
namespace json = boost::json;

namespace {

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

// "\x02kvfleet:N\x03": control characters no template writes and no filter (trim, upper) changes.
std::string marker(std::size_t i) { return "\x02kvfleet:" + std::to_string(i) + "\x03"; }

const json::string* content_of(const json::value& message) {
  const json::value* c = message.is_object() ? message.as_object().if_contains("content") : nullptr;
  return c && c->is_string() && !c->as_string().empty() ? &c->as_string() : nullptr;
}

// The marked render with the markers put back; true (and `ranges` filled) when it equals `rendered`.
bool ranges_from_markers(const std::string& marked, const std::string& rendered, const json::array& messages,
                         Ranges& ranges) {
  std::string rebuilt;
  std::size_t at = 0;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const json::string* content = content_of(messages[i]);
    if (!content) continue;
    const std::string m = marker(i);
    const std::size_t pos = marked.find(m, at);
    if (pos == std::string::npos || marked.find(m, pos + m.size()) != std::string::npos) return false;
    rebuilt.append(marked, at, pos - at);
    ranges.emplace_back(rebuilt.size(), rebuilt.size() + content->size());
    rebuilt.append(content->data(), content->size());
    at = pos + m.size();
  }
  rebuilt.append(marked, at);
  return rebuilt == rendered;
}

bool holds_special(const Tokenizer& tokenizer, std::string_view text) {
  for (TokenId id : tokenizer.encode(text, false))
    if (tokenizer.is_special(id)) return true;
  return false;
}

// Each content found verbatim in the render, in message order.
Ranges ranges_by_search(const Tokenizer& tokenizer, const std::string& rendered, const json::array& messages) {
  Ranges ranges;
  std::size_t at = 0;
  for (const auto& message : messages) {
    const json::string* content = content_of(message);
    if (!content) continue;
    const std::size_t pos = rendered.find(std::string_view(*content), at);
    if (pos == std::string::npos) {
      if (holds_special(tokenizer, *content))
        throw TemplateError("the chat template transforms message content that holds special-token text; it "
                            "cannot be tokenized safely with special tokens off in content");
      continue;
    }
    ranges.emplace_back(pos, pos + content->size());
    at = pos + content->size();
  }
  return ranges;
}

}  // namespace

std::vector<TokenId> tokenize_chat(const ChatTemplate& chat_template, const Tokenizer& tokenizer,
                                   const json::array& messages, const ChatTemplateOptions& options,
                                   bool special_tokens_in_content) {
  // The template writes the special tokens (BOS included) itself.
  const std::string rendered = chat_template.render(messages, options);
  if (special_tokens_in_content) return tokenizer.encode(rendered, false);
  json::array marked_messages = messages;
  for (std::size_t i = 0; i < marked_messages.size(); ++i)
    if (content_of(marked_messages[i])) marked_messages[i].as_object()["content"] = marker(i);
  Ranges ranges;
  if (!ranges_from_markers(chat_template.render(marked_messages, options), rendered, messages, ranges))
    ranges = ranges_by_search(tokenizer, rendered, messages);
  return tokenizer.encode(rendered, false, ranges);
}

}  // namespace kvfleet
