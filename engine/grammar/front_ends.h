// The front ends: each turns one GrammarSpec kind into the IR (ir.h). All throw GrammarError.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/grammar.h"
#include "engine/grammar/ir.h"

namespace kvfleet::grammar {

Grammar parse_gbnf(std::string_view text);

// How a regex's characters are written: as themselves, or inside a JSON string (where `"`, `\` and
// control characters take their escaped forms).
enum class RegexText { raw, json_string };
// A regex as an expression. `anchored`: the whole text must match (guided regex); otherwise JSON
// Schema's `pattern` semantics (a match anywhere unless ^ / $ anchor it).
ExprPtr regex_expr(std::string_view pattern, RegexText text, bool anchored);
Grammar regex_grammar(std::string_view pattern);

Grammar choice_grammar(const std::vector<std::string>& choices);

Grammar json_schema_grammar(std::string_view schema_json, const GrammarOptions& options);
Grammar json_object_grammar(const GrammarOptions& options);

}  // namespace kvfleet::grammar
