#include "engine/server/grammar_compiler.h"

#include <boost/json/serialize.hpp>
#include <memory>
#include <mutex>

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_cache.h"
#include "engine/grammar/vocabulary.h"

namespace kvfleet::server {

namespace {

// "#/properties/a/items" under "response_format.json_schema.schema" -> "...schema.properties.a.items.KEYWORD".
std::string keyword_param(const StructuredOutput& s, const grammar::GrammarError& e) {
  if (s.schema_param.empty()) return s.param;
  std::string out = s.schema_param;
  std::string_view path = e.schema_path();
  if (path.starts_with("#")) path.remove_prefix(1);
  for (const char c : path) out += c == '/' ? '.' : c;
  if (!e.keyword().empty()) out += "." + e.keyword();
  return out;
}

grammar::GrammarSpec spec_of(const StructuredOutput& s) {
  grammar::GrammarSpec g;
  switch (s.kind) {
    case StructuredOutput::Kind::json_object: g.kind = grammar::GrammarKind::json_object; break;
    case StructuredOutput::Kind::json_schema:
      g.kind = grammar::GrammarKind::json_schema;
      g.text = s.text.empty() ? boost::json::serialize(s.schema) : s.text;
      break;
    case StructuredOutput::Kind::regex: g.kind = grammar::GrammarKind::regex, g.text = s.text; break;
    case StructuredOutput::Kind::choice: g.kind = grammar::GrammarKind::choice, g.choices = s.choices; break;
    case StructuredOutput::Kind::grammar: g.kind = grammar::GrammarKind::gbnf, g.text = s.text; break;
  }
  return g;
}

}  // namespace

GrammarCompiler make_grammar_compiler(const Tokenizer& tokenizer, std::vector<TokenId> eos_ids, std::int64_t model_vocab) {
  struct State {
    std::once_flag once;
    std::shared_ptr<const grammar::Vocabulary> vocab;
    grammar::GrammarCache cache;
  };
  auto state = std::make_shared<State>();
  return [state, &tokenizer, eos_ids = std::move(eos_ids), model_vocab](const StructuredOutput& s) {
    std::call_once(state->once, [&] {
      auto v = grammar::Vocabulary::from_tokenizer(tokenizer, eos_ids);
      if (model_vocab > 0 && v->size() > static_cast<std::size_t>(model_vocab)) {  // ids the model cannot emit
        std::vector<std::string> bytes;
        for (std::int64_t id = 0; id < model_vocab; ++id) bytes.push_back(v->bytes(static_cast<TokenId>(id)));
        std::vector<TokenId> stops;
        for (const TokenId t : eos_ids)
          if (t < model_vocab) stops.push_back(t);
        v = std::make_shared<const grammar::Vocabulary>(std::move(bytes), std::move(stops));
      }
      state->vocab = std::move(v);
    });
    try {
      grammar::GrammarOptions options;
      if (s.compact) options.whitespace_bound = 0;
      return state->cache.get_or_compile(spec_of(s), state->vocab, options);
    } catch (const grammar::GrammarError& e) {
      throw StructuredOutputError(e.what(), keyword_param(s, e));
    }
  };
}

}  // namespace kvfleet::server
