// Chat templates: renders a model's Jinja `chat_template` (tokenizer_config.json) into a prompt string,
// byte for byte as Hugging Face transformers does with jinja2 (trim_blocks, lstrip_blocks,
// loopcontrols, its own tojson, raise_exception and strftime_now).
//
// The interpreter covers the Jinja subset that real chat templates use. A template that uses anything
// else fails with a TemplateError naming the construct and its line, e.g. "unsupported filter 'xmlattr'
// at line 3": unknown tags, filters and tests when it is loaded, unknown methods or functions when that
// code runs.
//
// Thread-safety: a ChatTemplate is immutable after construction. render() is const and may be called
// concurrently from any number of threads on the same object; each call has its own state.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <filesystem>
#include <optional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet {

// Parse errors, unsupported constructs, runtime type errors and raise_exception(msg) (whose what() is
// exactly msg) all throw this.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  boost::json::value tools;           // null: `tools` is none in the template (as transformers passes it)
  boost::json::object extra_context;  // extra variables, e.g. {"enable_thinking": false}; override others
};

class ChatTemplate {
 public:
  // Reads tokenizer_config.json (a file, or a model directory holding one). `chat_template` may be a
  // string or a list of {name, template}; `name` picks one ("default" when the file has a plain string).
  // chat_template.jinja and additional_chat_templates/NAME.jinja beside the config, as newer
  // transformers versions save them, take precedence. bos_token / eos_token may be strings or
  // {"content": ...} objects.
  static ChatTemplate from_tokenizer_config(const std::filesystem::path& tokenizer_config_json_or_model_dir,
                                            std::string_view name = "default");
  // A model directory's default template, or nullopt when it has no tokenizer_config.json or the template
  // cannot be used; then `why` (if given) says what was wrong. For servers that run without chat.
  static std::optional<ChatTemplate> from_model_dir(const std::filesystem::path& model_dir, std::string* why);
  // Names of the templates available there ({"default"} for a plain string).
  static std::vector<std::string> template_names(const std::filesystem::path& tokenizer_config_json_or_model_dir);
  // An empty bos/eos token leaves that variable undefined in the template (as transformers does for a
  // tokenizer without one).
  static ChatTemplate from_string(std::string source, std::string bos_token = "", std::string eos_token = "");

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Variables visible to the template: messages, tools, documents (none), add_generation_prompt,
  // bos_token, eos_token, then everything in opts.extra_context.
  std::string render(const boost::json::array& messages, const ChatTemplateOptions& opts = {}) const;

  const std::string& source() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfleet
