// Loading tokenizer.json (Hugging Face `tokenizers` format) plus the tokenizer_config.json and
// generation_config.json that sit next to it in a model directory.
#include "engine/core/tokenizer/parts.h"

#include <boost/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace kvfleet::tok {
namespace json = boost::json;
namespace fs = std::filesystem;
namespace {

TokenId to_id(const json::value& v) { return static_cast<TokenId>(v.to_number<std::int64_t>()); }

std::vector<std::pair<std::string, std::string>> parse_merges(const json::array& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const json::value& m : merges) {
    if (m.is_array()) {  // tokenizers >= 0.20: ["a", "b"]
      const json::array& pair = m.as_array();
      out.emplace_back(std::string(pair.at(0).as_string()), std::string(pair.at(1).as_string()));
      continue;
    }
    const std::string_view s = m.as_string();  // older: "a b"
    const std::size_t space = s.find(' ');
    if (space == std::string_view::npos) throw std::runtime_error("bad merge '" + std::string(s) + "'");
    out.emplace_back(std::string(s.substr(0, space)), std::string(s.substr(space + 1)));
  }
  return out;
}

std::vector<AddedToken> parse_added(const json::value& added) {
  std::vector<AddedToken> out;
  if (!added.is_array()) return out;
  auto flag = [](const json::object& o, const char* key) {
    const auto* v = o.if_contains(key);
    return v && v->is_bool() && v->as_bool();
  };
  for (const json::value& v : added.as_array()) {
    const json::object& o = v.as_object();
    out.push_back({std::string(o.at("content").as_string()), to_id(o.at("id")), flag(o, "special"),
                   flag(o, "normalized"), flag(o, "lstrip"), flag(o, "rstrip"),
                   flag(o, "single_word")});
  }
  return out;
}

std::optional<TokenId> find_id(const TokenizerData& data, std::string_view token) {
  const auto it = data.token_to_id.find(token);
  if (it == data.token_to_id.end()) return std::nullopt;
  return it->second;
}

TokenId require_id(const TokenizerData& data, std::string_view token) {
  if (auto id = find_id(data, token)) return *id;
  throw std::runtime_error("post_processor names unknown token '" + std::string(token) + "'");
}

// Fills prefix_ids/suffix_ids; returns whether the processor adds special tokens itself.
bool parse_post_processor(const json::value& config, TokenizerData& data) {
  if (config.is_null()) return false;
  const json::object& obj = config.as_object();
  const std::string_view type = obj.at("type").as_string();
  if (type == "ByteLevel") return false;
  if (type == "Sequence") {
    bool adds = false;
    for (const json::value& p : obj.at("processors").as_array()) adds = parse_post_processor(p, data) || adds;
    return adds;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    data.prefix_ids = {to_id(obj.at("cls").as_array().at(1))};
    data.suffix_ids = {to_id(obj.at("sep").as_array().at(1))};
    return true;
  }
  if (type != "TemplateProcessing") {
    throw std::runtime_error("unsupported post_processor type '" + std::string(type) + "'");
  }
  const json::object* specials = obj.contains("special_tokens") ? &obj.at("special_tokens").as_object() : nullptr;
  bool after_sequence = false;
  for (const json::value& item : obj.at("single").as_array()) {
    const json::object& piece = item.as_object();
    if (piece.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    const std::string_view name = piece.at("SpecialToken").as_object().at("id").as_string();
    std::vector<TokenId> ids;
    if (specials && specials->contains(name)) {
      for (const json::value& id : specials->at(name).as_object().at("ids").as_array()) ids.push_back(to_id(id));
    } else {
      ids.push_back(require_id(data, name));
    }
    auto& target = after_sequence ? data.suffix_ids : data.prefix_ids;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  return true;
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::optional<std::string> token_text(const json::object& config, const char* key) {
  const auto* v = config.if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_string()) return std::string(v->as_string());
  if (v->is_object() && v->as_object().contains("content")) {
    return std::string(v->as_object().at("content").as_string());
  }
  return std::nullopt;
}

bool config_flag(const json::object& config, const char* key) {
  const auto* v = config.if_contains(key);
  return v && v->is_bool() && v->as_bool();
}

}  // namespace

json::value read_json_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer: cannot open " + file.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  boost::system::error_code ec;
  json::value v = json::parse(buffer.str(), ec);
  if (ec) throw std::runtime_error("tokenizer: " + file.string() + ": invalid JSON: " + ec.message());
  return v;
}

void index_vocab(TokenizerData& data, const std::vector<std::pair<std::string, TokenId>>& vocab,
                 const std::vector<AddedToken>& added) {
  TokenId max_id = -1;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : added) max_id = std::max(max_id, t.id);
  const auto size = static_cast<std::size_t>(max_id + 1);
  data.id_to_token.assign(size, {});
  data.is_special.assign(size, 0);
  data.token_to_id.reserve(vocab.size() + added.size());
  for (const auto& [token, id] : vocab) {
    if (id < 0) throw std::runtime_error("tokenizer: negative id for '" + token + "'");
    data.id_to_token[id] = token;
    data.token_to_id.emplace(token, id);
  }
  for (const AddedToken& t : added) {
    data.id_to_token[t.id] = t.content;
    data.token_to_id.insert_or_assign(t.content, t.id);
    data.is_special[t.id] = t.special ? 1 : 0;
  }
}

void read_model_configs(TokenizerData& data, const fs::path& dir, bool post_processor_adds) {
  const fs::path config_file = dir / "tokenizer_config.json";
  if (fs::exists(config_file)) {
    const json::value root = read_json_file(config_file);
    const json::object& config = root.as_object();
    if (auto bos = token_text(config, "bos_token")) data.bos = find_id(data, *bos);
    if (auto eos = token_text(config, "eos_token")) {
      if (auto id = find_id(data, *eos)) data.eos.push_back(*id);
    }
    // Without a post-processor template, transformers' slow tokenizers add BOS/EOS from these flags.
    if (!post_processor_adds) {
      if (config_flag(config, "add_bos_token") && data.bos) data.prefix_ids = {*data.bos};
      if (config_flag(config, "add_eos_token") && !data.eos.empty()) data.suffix_ids = {data.eos[0]};
    }
  }
  if (!data.bos && !data.prefix_ids.empty()) data.bos = data.prefix_ids.front();
  const fs::path generation_file = dir / "generation_config.json";
  if (fs::exists(generation_file)) {
    const json::value root = read_json_file(generation_file);
    if (const auto* eos = root.as_object().if_contains("eos_token_id")) {
      std::vector<TokenId> ids;
      if (eos->is_array()) {
        for (const json::value& id : eos->as_array()) ids.push_back(to_id(id));
      } else if (eos->is_number()) {
        ids.push_back(to_id(*eos));
      }
      for (const TokenId id : ids) {
        if (std::find(data.eos.begin(), data.eos.end(), id) == data.eos.end()) data.eos.push_back(id);
      }
    }
  }
}

std::unique_ptr<TokenizerData> load_tokenizer_json(const fs::path& file) {
  const json::value root_value = read_json_file(file);
  try {
    const json::object& root = root_value.as_object();
    const json::object& model = root.at("model").as_object();
    if (const auto* type = model.if_contains("type"); type && type->as_string() != "BPE") {
      throw std::runtime_error("unsupported model type '" + std::string(type->as_string()) +
                               "' (only BPE is implemented)");
    }
    std::vector<std::pair<std::string, TokenId>> vocab;
    const json::object& vocab_obj = model.at("vocab").as_object();
    vocab.reserve(vocab_obj.size());
    for (const auto& kv : vocab_obj) vocab.emplace_back(std::string(kv.key()), to_id(kv.value()));
    const auto merges = parse_merges(model.at("merges").as_array());
    std::vector<AddedToken> added = parse_added(root.contains("added_tokens") ? root.at("added_tokens") : json::value());

    auto data = std::make_unique<TokenizerData>();
    data->normalizer = make_normalizer(root.contains("normalizer") ? root.at("normalizer") : json::value());
    data->pre_tokenizer = make_pre_tokenizer(root.contains("pre_tokenizer") ? root.at("pre_tokenizer") : json::value());
    index_vocab(*data, vocab, added);

    auto flag = [&](const char* key) { return config_flag(model, key); };
    BpeOptions options{data->pre_tokenizer && data->pre_tokenizer->byte_level(), flag("byte_fallback"),
                       flag("ignore_merges"), flag("fuse_unk"), std::nullopt};
    if (const auto* unk = model.if_contains("unk_token"); unk && unk->is_string()) {
      options.unk_id = find_id(*data, unk->as_string());
    }
    data->model = std::make_unique<BpeModel>(vocab, merges, options);

    data->decoder = make_decoder_table(root.contains("decoder") ? root.at("decoder") : json::value(),
                                       data->id_to_token);
    data->added = AddedTokenMatcher(std::move(added));
    const bool adds = parse_post_processor(
        root.contains("post_processor") ? root.at("post_processor") : json::value(), *data);
    read_model_configs(*data, file.parent_path(), adds);
    return data;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string prefix = what.starts_with("tokenizer: ") ? what.substr(11) : what;
    throw std::runtime_error("tokenizer: " + file.string() + ": " + prefix);
  }
}

}  // namespace kvfleet::tok
