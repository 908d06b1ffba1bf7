// ChatTemplate: loads chat_template / bos_token / eos_token from tokenizer_config.json and renders
// with the variables transformers' apply_chat_template passes.
#include "kvfleet/chat_template.h"

#include <boost/json.hpp>

#include <algorithm>
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

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TemplateError("cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tokenizer_config.json, given the file itself or the model directory that holds it.
std::filesystem::path config_path(const std::filesystem::path& path) {
  return std::filesystem::is_directory(path) ? path / "tokenizer_config.json" : path;
}

boost::json::object read_config(const std::filesystem::path& path) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(read_text(path), ec);
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

// chat_template as a list of {"name": ..., "template": ...}.
void list_templates(const boost::json::value& t, std::vector<std::pair<std::string, std::string>>& out) {
  if (!t.is_array()) throw TemplateError("chat_template must be a string or a list of {name, template}");
  for (const auto& item : t.get_array()) {
    const auto* o = item.if_object();
    const auto* name = o ? o->if_contains("name") : nullptr;
    const auto* tmpl = o ? o->if_contains("template") : nullptr;
    if (!name || !tmpl || !name->is_string() || !tmpl->is_string())
      throw TemplateError("chat_template list entries must be {\"name\": str, \"template\": str}");
    out.emplace_back(std::string(name->get_string()), std::string(tmpl->get_string()));
  }
}

// Adds or replaces the template called `name`.
void set_template(std::vector<std::pair<std::string, std::string>>& out, std::string name, std::string source) {
  for (auto& [n, src] : out)
    if (n == name) {
      src = std::move(source);
      return;
    }
  out.emplace_back(std::move(name), std::move(source));
}

// Newer transformers versions save templates as files next to the config: chat_template.jinja (the
// default) and additional_chat_templates/NAME.jinja. Those take precedence over the JSON entries.
void add_template_files(std::vector<std::pair<std::string, std::string>>& out, const std::filesystem::path& dir) {
  if (std::filesystem::is_regular_file(dir / "chat_template.jinja"))
    set_template(out, "default", read_text(dir / "chat_template.jinja"));
  const auto extra = dir / "additional_chat_templates";
  if (!std::filesystem::is_directory(extra)) return;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(extra))
    if (entry.is_regular_file() && entry.path().extension() == ".jinja") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) set_template(out, f.stem().string(), read_text(f));
}

// (name, source) pairs; a plain string is the single template "default".
std::vector<std::pair<std::string, std::string>> templates_of(const boost::json::object& config,
                                                              const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const boost::json::value* t = config.if_contains("chat_template");
  if (t && t->is_string()) out.emplace_back("default", std::string(t->get_string()));
  if (t && !t->is_null() && !t->is_string()) list_templates(*t, out);
  add_template_files(out, dir);
  return out;
}

// Bytes of text in a JSON value: most of it reaches the prompt, so it sizes the output buffer.
size_t text_bytes(const boost::json::value& v) {
  if (v.is_string()) return v.get_string().size();
  size_t n = 0;
  if (v.is_array())
    for (const auto& x : v.get_array()) n += text_bytes(x);
  if (v.is_object())
    for (const auto& kv : v.get_object()) n += kv.key().size() + text_bytes(kv.value());
  return n;
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

std::optional<ChatTemplate> ChatTemplate::from_model_dir(const std::filesystem::path& dir, std::string* why) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) {
    if (why) *why = path.string() + " not found";
    return std::nullopt;
  }
  try {
    return from_tokenizer_config(path);
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

std::vector<std::string> ChatTemplate::template_names(const std::filesystem::path& path_in) {
  const auto path = config_path(path_in);
  std::vector<std::string> names;
  for (auto& [name, src] : templates_of(read_config(path), path.parent_path())) names.push_back(name);
  return names;
}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::filesystem::path& path_in, std::string_view name) {
  const auto path = config_path(path_in);
  boost::json::object config = read_config(path);
  auto templates = templates_of(config, path.parent_path());
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
  size_t hint = 0;
  for (const auto& m : messages) hint += text_bytes(m) + 64;  // + role markers and the like
  return jinja::render_template(impl_->tree, ctx, hint + text_bytes(opts.tools) + 1024);
}

const std::string& ChatTemplate::source() const { return impl_->source; }

}  // namespace kvfleet
