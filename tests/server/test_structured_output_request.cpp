// Structured-output fields: response_format, structured_outputs and guided_* become one StructuredOutput on
// both endpoints; a malformed field, an unimplemented one and a second constraint are each a 400 naming it.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "engine/server/api/request.h"

using namespace kvfleet;
using namespace kvfleet::server;

namespace {

const std::string kChat = R"({"messages":[{"role":"user","content":"hi"}],)";
const std::string kCompletion = R"({"prompt":"hi",)";

// The request's constraint on both endpoints (they must agree).
std::optional<StructuredOutput> parsed(const std::string& fields) {
  auto chat = parse_chat_request(parse_json_body(kChat + fields + "}")).params.structured;
  auto completion = parse_completion_request(parse_json_body(kCompletion + fields + "}")).params.structured;
  CHECK(chat.has_value() == completion.has_value());
  if (chat && completion) {
    CHECK(chat->kind == completion->kind);
    CHECK(chat->text == completion->text);
    CHECK(chat->param == completion->param);
  }
  return chat;
}

// The 400's param on both endpoints (they must agree); "none" when there is no error.
std::string param_of(const std::string& fields) {
  std::string params[2];
  for (int i = 0; i < 2; ++i) {
    try {
      const auto body = parse_json_body((i ? kCompletion : kChat) + fields + "}");
      if (i) parse_completion_request(body);
      else parse_chat_request(body);
      params[i] = "none";
    } catch (const ApiError& e) {
      CHECK(e.status == 400);
      CHECK(e.type == "invalid_request_error");
      params[i] = e.param;
    }
  }
  CHECK(params[0] == params[1]);
  return params[0];
}

}  // namespace

TEST_CASE("response_format: text is no constraint; json_object; json_schema with name, schema, strict, description") {
  CHECK_FALSE(parsed(R"("response_format":{"type":"text"})"));
  CHECK_FALSE(parsed(R"("max_tokens":3)"));
  auto o = parsed(R"("response_format":{"type":"json_object"})");
  REQUIRE(o);
  CHECK(o->kind == StructuredOutput::Kind::json_object);
  CHECK(o->param == "response_format");
  auto s = parsed(R"("response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,
    "description":"a person","schema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}})");
  REQUIRE(s);
  CHECK(s->kind == StructuredOutput::Kind::json_schema);
  CHECK(s->name == "person");
  CHECK(s->strict);
  CHECK(s->description == "a person");
  CHECK(s->schema_param == "response_format.json_schema.schema");
  CHECK(s->schema.at("required").as_array().size() == 1);
  CHECK(boost::json::parse(s->text) == s->schema);
  auto b = parsed(R"("response_format":{"type":"json_schema","json_schema":{"name":"any","schema":true}})");
  REQUIRE(b);
  CHECK(b->schema == boost::json::value(true));
}

TEST_CASE("structured_outputs and guided_*: json (object or string), regex, choice, grammar, json_object") {
  auto j = parsed(R"("structured_outputs":{"json":{"type":"integer"}})");
  REQUIRE(j);
  CHECK(j->kind == StructuredOutput::Kind::json_schema);
  CHECK(j->param == "structured_outputs.json");
  auto js = parsed(R"("guided_json":"{\"type\":\"integer\"}")");
  REQUIRE(js);
  CHECK(js->schema == j->schema);
  CHECK(js->param == "guided_json");
  CHECK(js->schema_param == "guided_json");
  auto r = parsed(R"("structured_outputs":{"regex":"[a-z]+"})");
  REQUIRE(r);
  CHECK(r->kind == StructuredOutput::Kind::regex);
  CHECK(r->text == "[a-z]+");
  CHECK(parsed(R"("guided_regex":"\\d{3}")")->text == "\\d{3}");
  auto c = parsed(R"("guided_choice":["yes","no",""],"guided_decoding_backend":"xgrammar")");
  REQUIRE(c);
  CHECK(c->kind == StructuredOutput::Kind::choice);
  CHECK(c->choices == std::vector<std::string>{"yes", "no", ""});
  CHECK(parsed(R"("structured_outputs":{"choice":["a"]})")->choices == std::vector<std::string>{"a"});
  auto g = parsed(R"("structured_outputs":{"grammar":"root ::= \"a\""})");
  REQUIRE(g);
  CHECK(g->kind == StructuredOutput::Kind::grammar);
  CHECK(parsed(R"("guided_grammar":"root ::= \"b\"")")->text == "root ::= \"b\"");
  CHECK(parsed(R"("structured_outputs":{"json_object":true})")->kind == StructuredOutput::Kind::json_object);
  // Asking for nothing asks for nothing: an empty object, json_object false, the flags at their defaults.
  CHECK_FALSE(parsed(R"("structured_outputs":{})"));
  CHECK_FALSE(parsed(R"("structured_outputs":{"json_object":false,"disable_any_whitespace":false})"));
  // disable_any_whitespace: compact JSON (no whitespace between tokens), for json and json_object.
  CHECK_FALSE(parsed(R"("structured_outputs":{"json":{"type":"object"}})")->compact);
  CHECK(parsed(R"("structured_outputs":{"json":{"type":"object"},"disable_any_whitespace":true})")->compact);
  CHECK(parsed(R"("structured_outputs":{"json_object":true,"disable_any_whitespace":true})")->compact);
  CHECK_FALSE(parsed(R"("structured_outputs":{"json_object":true,"disable_any_whitespace":false})")->compact);
}

TEST_CASE("each malformed or unimplemented structured-output field is a 400 naming it") {
  const std::pair<const char*, const char*> cases[] = {
      {R"("response_format":"json")", "response_format"},
      {R"("response_format":{})", "response_format.type"},
      {R"("response_format":{"type":"xml"})", "response_format.type"},
      {R"("response_format":{"type":"structural_tag"})", "response_format.type"},
      {R"("response_format":{"type":"json_object","schema":{}})", "response_format.schema"},
      {R"("response_format":{"type":"json_schema"})", "response_format.json_schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})", "response_format.json_schema.schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":5}})", "response_format.json_schema.schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":"{}"}})", "response_format.json_schema.schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{}}})", "response_format.json_schema.name"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}})", "response_format.json_schema.name"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{},"strict":"yes"}})", "response_format.json_schema.strict"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{},"description":1}})", "response_format.json_schema.description"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{},"format":"y"}})", "response_format.json_schema.format"},
      {R"("structured_outputs":[])", "structured_outputs"},
      {R"("structured_outputs":{"json":"{not json"})", "structured_outputs.json"},
      {R"("structured_outputs":{"json":[1]})", "structured_outputs.json"},
      {R"("structured_outputs":{"regex":""})", "structured_outputs.regex"},
      {R"("structured_outputs":{"regex":5})", "structured_outputs.regex"},
      {R"("structured_outputs":{"choice":[]})", "structured_outputs.choice"},
      {R"("structured_outputs":{"choice":["a",1]})", "structured_outputs.choice"},
      {R"("structured_outputs":{"grammar":{}})", "structured_outputs.grammar"},
      {R"("structured_outputs":{"json_object":"yes"})", "structured_outputs.json_object"},
      {R"("structured_outputs":{"regex":"a","choice":["a"]})", "structured_outputs.choice"},
      {R"("structured_outputs":{"structural_tag":"{}"})", "structured_outputs.structural_tag"},
      {R"("structured_outputs":{"regex":"a","whitespace_pattern":" "})", "structured_outputs.whitespace_pattern"},
      {R"("structured_outputs":{"regex":"a","disable_any_whitespace":true})", "structured_outputs.disable_any_whitespace"},
      {R"("structured_outputs":{"disable_any_whitespace":true})", "structured_outputs.disable_any_whitespace"},
      {R"("structured_outputs":{"json":{},"disable_any_whitespace":"yes"})", "structured_outputs.disable_any_whitespace"},
      {R"("structured_outputs":{"regex":"a","backend":"x"})", "structured_outputs.backend"},
      {R"("guided_json":7)", "guided_json"},
      {R"("guided_regex":["a"])", "guided_regex"},
      {R"("guided_choice":"a")", "guided_choice"},
      {R"("guided_grammar":"")", "guided_grammar"},
      {R"("guided_whitespace_pattern":" ")", "guided_whitespace_pattern"},
      {R"("guided_decoding_backend":1)", "guided_decoding_backend"},
      // More than one constraint: the second one named.
      {R"("response_format":{"type":"json_object"},"guided_regex":"a")", "guided_regex"},
      {R"("response_format":{"type":"json_object"},"structured_outputs":{"regex":"a"})", "structured_outputs.regex"},
      {R"("guided_choice":["a"],"guided_json":{})", "guided_choice"},
  };
  for (const auto& [fields, param] : cases) {
    CAPTURE(fields);
    CHECK(param_of(fields) == param);
  }
  // response_format text beside a constraint is no second constraint.
  CHECK(param_of(R"("response_format":{"type":"text"},"guided_regex":"a")") == "none");
}
