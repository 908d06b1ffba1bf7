// ChatTemplate: loads chat_template / bos_token / eos_token from tokenizer_config.json and renders
// with the variables transformers' apply_chat_template passes.
#include "kvfleet/chat_template.h"

#include <boost/json.hpp>

#include <fstream>
#include <sstream>

#include "engine/core/chat_template/interpreter.h"
#include "engine/core/chat_template/parser.h"

namespace kvfleet {

struct ChatTemplate::Impl {
  std::string source;
  std::string bos_token;
  std::string eos_token;
  jinja::Template tree;
};

namespace {

boost::json::object read_config(const std::filesystem::path& path_in) {
  std::filesystem::path path = path_in;
  if (std::filesystem::is_directory(path)) path /= "tokenizer_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TemplateError("cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(ss.str(), ec);
  if (ec || !v.is_object()) throw TemplateError(path.string() + " is not a JSON object");
  return std::move(v.as_object());
}

// A special token is a string or an AddedToken object {"content": ...}; anything else means none.
std::string special_token(const boost::json::object& config, std::string_view key) {
  const boost::json::value* v = config.if_contains(key);
  if (!v) return "";
  if (v->is_string()) return std::string(v->get_string());
  if (v->is_object())
    if (const auto* c = v->get_object().if_contains("content"); c && c->is_string()) return std::string(c->get_string());
  return "";
}

// (name, source) pairs; a plain string is the single template "default".
std::vector<std::pair<std::string, std::string>> templates_of(const boost::json::object& config) {
  std::vector<std::pair<std::string, std::string>> out;
  const boost::json::value* t = config.if_contains("chat_template");
  if (!t || t->is_null()) return out;
  if (t->is_string()) {
    out.emplace_back("default", std::string(t->get_string()));
    return out;
  }
  if (!t->is_array()) throw TemplateError("chat_template must be a string or a list of {name, template}");
  for (const auto& item : t->get_array()) {
    const auto* o = item.if_object();
    const auto* name = o ? o->if_contains("name") : nullptr;
    const auto* tmpl = o ? o->if_contains("template") : nullptr;
    if (!name || !tmpl || !name->is_string() || !tmpl->is_string())
      throw TemplateError("chat_template list entries must be {\"name\": str, \"template\": str}");
    out.emplace_back(std::string(name->get_string()), std::string(tmpl->get_string()));
  }
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::from_string(std::string source, std::string bos_token, std::string eos_token) {
  auto impl = std::make_unique<Impl>();
  impl->tree = jinja::parse_template(source);
  jinja::validate_template(impl->tree);
  impl->source = std::move(source);
  impl->bos_token = std::move(bos_token);
  impl->eos_token = std::move(eos_token);
  return ChatTemplate(std::move(impl));
}

std::vector<std::string> ChatTemplate::template_names(const std::filesystem::path& path) {
  std::vector<std::string> names;
  for (auto& [name, src] : templates_of(read_config(path))) names.push_back(name);
  return names;
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::filesystem::path& path, std::string_view name) {
  boost::json::object config = read_config(path);
  auto templates = templates_of(config);
  if (templates.empty()) throw TemplateError(path.string() + " has no chat_template");
  for (auto& [n, src] : templates) {
    if (n != name) continue;
    try {
      return from_string(std::move(src), special_token(config, "bos_token"), special_token(config, "eos_token"));
    } catch (const TemplateError& e) {
      throw TemplateError("chat template '" + n + "' in " + path.string() + ": " + e.what());
    }
  }
  throw TemplateError(path.string() + " has no chat template named '" + std::string(name) + "'");
}

std::string ChatTemplate::render(const boost::json::array& messages, const ChatTemplateOptions& opts) const {
  jinja::Dict ctx;
  ctx.items.reserve(6 + opts.extra_context.size());
  ctx.set("messages", jinja::Value::from_json(messages));
  ctx.set("tools", jinja::Value::from_json(opts.tools));
  ctx.set("documents", jinja::Value(jinja::None{}));
  ctx.set("add_generation_prompt", jinja::Value(opts.add_generation_prompt));
  if (!impl_->bos_token.empty()) ctx.set("bos_token", jinja::Value(impl_->bos_token));
  if (!impl_->eos_token.empty()) ctx.set("eos_token", jinja::Value(impl_->eos_token));
  for (const auto& kv : opts.extra_context) ctx.set(std::string(kv.key()), jinja::Value::from_json(kv.value()));
  return jinja::render_template(impl_->tree, ctx);
}

const std::string& ChatTemplate::source() const { return impl_->source; }

}  // namespace kvfleet
