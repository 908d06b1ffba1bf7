// OpenAI request bodies as the replica parses them (engine/server/api/request.h): the same bytes go
// through parse_json_body and both parsers, /v1/completions' and /v1/chat/completions'. The contract:
// bad input is an ApiError with a 4xx status; anything else escaping (std::out_of_range from a
// json::at(), a bad_alloc, a 5xx) would reach the client as a 500, which for input is a bug.
#include <boost/json.hpp>
#include <exception>
#include <string>
#include <typeinfo>

#include "engine/server/api/request.h"
#include "fuzz/fuzz_support.h"

namespace {

using kvfleet::server::ApiError;

template <class Parse>
void expect_4xx_or_ok(const boost::json::value& body, Parse parse) {
  try {
    parse(body);
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status > 499) kvfleet::fuzz::finding("ApiError with status " + std::to_string(e.status), e.what());
  } catch (const std::exception& e) {
    kvfleet::fuzz::finding(std::string("unexpected exception ") + typeid(e).name(), e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  boost::json::value body;
  try {
    body = kvfleet::server::parse_json_body(kvfleet::fuzz::as_text(data, size));
  } catch (const ApiError& e) {
    if (e.status != 400) kvfleet::fuzz::finding("parse_json_body status " + std::to_string(e.status), e.what());
    return 0;
  } catch (const std::exception& e) {
    kvfleet::fuzz::finding(std::string("parse_json_body threw ") + typeid(e).name(), e.what());
  }
  expect_4xx_or_ok(body, [](const boost::json::value& b) { kvfleet::server::parse_completion_request(b); });
  expect_4xx_or_ok(body, [](const boost::json::value& b) { kvfleet::server::parse_chat_request(b); });
  return 0;
}
