#include "kvfleet/chat_content.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

namespace kvfleet {
namespace json = boost::json;

namespace {

// The string field `key` of a part; nullptr when absent or null (as the request parsers treat null).
const json::string* string_field(const json::object& part, const char* key, const std::string& at) {
  const json::value* v = part.if_contains(key);
  if (!v || v->is_null()) return nullptr;
  const std::string name = at + "." + key;
  if (!v->is_string()) throw ContentPartError("'" + name + "' must be a string", name);
  return &v->as_string();
}

bool media_part(std::string_view type) {
  return type == "image_url" || type == "input_audio" || type == "file" || type == "video_url" || type == "refusal";
}

}  // namespace

std::string join_content_parts(const json::array& parts, std::string_view where) {
  std::string text;
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::string at = std::string(where) + "[" + std::to_string(j) + "]";
    if (!parts[j].is_object()) throw ContentPartError("'" + at + "' must be an object", at);
    const json::object& part = parts[j].as_object();
    const json::string* type = string_field(part, "type", at);
    if (!type) throw ContentPartError("'" + at + ".type' is required", at + ".type");
    const std::string type_name(*type);
    if (media_part(type_name))
      throw ContentPartError("content parts of type '" + type_name + "' are not supported by this text-only model",
                             at + ".type");
    if (type_name != "text") throw ContentPartError("unknown content part type '" + type_name + "'", at + ".type");
    const json::string* piece = string_field(part, "text", at);
    if (!piece) throw ContentPartError("'" + at + ".text' is required for a text part", at + ".text");
    text.append(piece->data(), piece->size());
  }
  return text;
}

}  // namespace kvfleet
