// The router's Responses API parts: which stored response a request continues, the bounded map of
// response owners, and the error event it writes into a broken Responses stream.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "router/gateway/response_owners.h"
#include "router/gateway/responses_routing.h"

using namespace kvfleet::router;
namespace json = boost::json;

namespace {

std::optional<std::string> continued(const char* body) { return continued_response(json::parse(body).as_object()); }

}  // namespace

TEST_CASE("a request continues its previous_response_id, else the response of its first item_reference") {
  CHECK(continued(R"({"input":"x","previous_response_id":"resp_ab"})") == "resp_ab");
  CHECK(continued(R"({"input":[{"role":"user","content":"x"},{"type":"item_reference","id":"msg_0123abcd_1"}]})") ==
        "resp_0123abcd");
  CHECK(continued(R"({"input":[{"type":"item_reference","id":"fc_ff_12"}]})") == "resp_ff");
  CHECK(!continued(R"({"input":"x"})"));
  CHECK(!continued(R"({"input":[{"type":"item_reference","id":"opaque"}]})"));
  CHECK(!continued(R"({"input":[{"type":"item_reference","id":7}]})"));
}

TEST_CASE("response owners: bounded, least recently used out first; a removed replica's responses are forgotten") {
  ResponseOwners owners(2);
  owners.remember("resp_a", "http://r1");
  owners.remember("resp_b", "http://r2");
  CHECK(owners.find("resp_a") == "http://r1");  // a is now the most recent: b goes next
  owners.remember("resp_c", "http://r1");
  CHECK(owners.size() == 2);
  CHECK(!owners.find("resp_b"));
  owners.forget("resp_c");
  CHECK(!owners.find("resp_c"));
  owners.remember("resp_d", "http://r2");
  owners.forget_replica("http://r1");
  CHECK(!owners.find("resp_a"));
  CHECK(owners.find("resp_d") == "http://r2");
  ResponseOwners none(0);
  none.remember("resp_a", "http://r1");
  CHECK(!none.find("resp_a"));
}

TEST_CASE("a broken Responses stream ends with an error event numbered after the last one relayed") {
  CHECK(last_sequence_number(R"(data: {"type":"x","sequence_number":7}\n\ndata: {"type":"y","sequence_number":12,)", -1) == 12);
  CHECK(last_sequence_number("data: {\"type\":\"x\",\"sequence_numb", 4) == 4);  // cut before the number
  CHECK(last_sequence_number("no events", 3) == 3);
  const std::string event = responses_error_event(13, "upstream_error", "the replica failed mid-stream");
  REQUIRE(event.rfind("event: error\ndata: ", 0) == 0);
  const json::object data = json::parse(event.substr(19)).as_object();
  CHECK(data.at("type") == "error");
  CHECK(data.at("sequence_number") == 13);
  CHECK(data.at("code") == "upstream_error");
  CHECK(data.at("error").at("message") == "the replica failed mid-stream");
}
