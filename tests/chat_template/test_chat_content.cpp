// join_content_parts: the one rule the replica and the router share for content given as parts.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <string>

#include "kvfleet/chat_content.h"

using namespace kvfleet;

namespace {

std::string join(const char* parts) {
  return join_content_parts(boost::json::parse(parts).as_array(), "messages[0].content");
}

// The param of the error that joining `parts` throws ("" when it throws none).
std::string error_param(const char* parts) {
  try {
    join(parts);
  } catch (const ContentPartError& e) {
    return e.param;
  }
  return "";
}

}  // namespace

TEST_CASE("text parts are joined in order, with nothing between them") {
  CHECK(join(R"([{"type":"text","text":"Hello, "},{"type":"text","text":"world"}])") == "Hello, world");
  CHECK(join(R"([{"type":"text","text":""}])").empty());
  CHECK(join("[]").empty());
}

TEST_CASE("a part that is not text is an error naming it") {
  CHECK(error_param(R"([{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}])") ==
        "messages[0].content[1].type");
  CHECK(error_param(R"([{"type":"input_audio"}])") == "messages[0].content[0].type");
  CHECK(error_param(R"([{"type":"bogus"}])") == "messages[0].content[0].type");
  CHECK(error_param(R"([{"text":"x"}])") == "messages[0].content[0].type");
  CHECK(error_param(R"([{"type":null,"text":"x"}])") == "messages[0].content[0].type");
  CHECK(error_param(R"([{"type":5}])") == "messages[0].content[0].type");
  CHECK(error_param(R"([{"type":"text"}])") == "messages[0].content[0].text");
  CHECK(error_param(R"([{"type":"text","text":5}])") == "messages[0].content[0].text");
  CHECK(error_param(R"(["x"])") == "messages[0].content[0]");
  CHECK(error_param("[null]") == "messages[0].content[0]");
}

TEST_CASE("the error's message says what is wrong") {
  try {
    join(R"([{"type":"image_url"}])");
    FAIL("no error");
  } catch (const ContentPartError& e) {
    CHECK(std::string(e.what()) == "content parts of type 'image_url' are not supported by this text-only model");
  }
}
