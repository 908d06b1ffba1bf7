// StreamSplice (router/gateway/stream_splice.h): whole events only, the ids taken off and kept, the
// stream's id and created from its first chunk, and when a stream is resumable.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "router/gateway/stream_splice.h"

using namespace kvfleet;
using namespace kvfleet::router;

namespace {

std::string chunk(const std::string& text, const std::string& ids, const char* finish = "null") {
  return "data: {\"id\":\"cmpl-7\",\"object\":\"text_completion\",\"created\":42,\"model\":\"m\",\"choices\":[{\"index\":0,"
         "\"finish_reason\":" + std::string(finish) + ",\"logprobs\":null,\"text\":\"" + text + "\"}]" +
         (ids.empty() ? "" : ",\"kvfleet_token_ids\":[" + ids + "]") + "}\n\n";
}

std::string client_view(const std::string& text, const char* finish = "null") {
  return "data: {\"id\":\"cmpl-7\",\"object\":\"text_completion\",\"created\":42,\"model\":\"m\",\"choices\":[{\"index\":0,"
         "\"finish_reason\":" + std::string(finish) + ",\"logprobs\":null,\"text\":\"" + text + "\"}]}\n\n";
}

}  // namespace

TEST_CASE("splice: events cut anywhere come out whole, without their ids, which are kept") {
  const std::string stream = chunk("Hel", "9,10") + chunk("lo \\\",\\\"kvfleet_token_ids\\\":[", "11") + chunk("", "");
  for (std::size_t step : {std::size_t{1}, std::size_t{3}, std::size_t{7}, stream.size()}) {
    CAPTURE(step);
    StreamSplice s;
    std::string out;
    for (std::size_t i = 0; i < stream.size(); i += step) {
      const std::string piece = s.feed(std::string_view(stream).substr(i, step));
      // Only whole events: every piece ends at an event's end.
      if (!piece.empty()) CHECK(piece.ends_with("\n\n"));
      out += piece;
    }
    CHECK(out == client_view("Hel") + client_view("lo \\\",\\\"kvfleet_token_ids\\\":[") + client_view(""));
    CHECK(s.output_ids() == std::vector<TokenId>{9, 10, 11});
    CHECK(s.id() == "cmpl-7");
    CHECK(s.created() == 42);
    CHECK(!s.resumable());  // the last chunk came without its ids
  }
}

TEST_CASE("splice: resumable until the stream ends; a broken event is dropped") {
  StreamSplice s;
  CHECK(!s.started());
  CHECK(s.feed(chunk("a", "1") + chunk("b", "2").substr(0, 20)) == client_view("a"));
  CHECK(s.started());
  CHECK(s.resumable());
  s.drop_partial();  // the replica died mid-event: the half event never reaches the client
  CHECK(s.feed(chunk("b", "2")) == client_view("b"));
  CHECK(s.output_ids() == std::vector<TokenId>{1, 2});
  CHECK(s.resumable());
  CHECK(s.feed(chunk("c", "3", "\"length\"")) == client_view("c", "\"length\""));
  CHECK(!s.resumable());  // finished: nothing to resume
  CHECK(s.ended());
  CHECK(s.feed("data: [DONE]\n\n") == "data: [DONE]\n\n");
}

TEST_CASE("splice: error events, foreign framing and comments") {
  StreamSplice errored;
  errored.feed(chunk("a", "1"));
  CHECK(errored.feed("data: {\"error\":{\"message\":\"x\"}}\n\n") == "data: {\"error\":{\"message\":\"x\"}}\n\n");
  CHECK(!errored.resumable());
  StreamSplice crlf;  // \r\n line ends are events too
  CHECK(crlf.feed("data: {\"id\":\"c\",\"created\":1,\"kvfleet_token_ids\":[4]}\r\n\r\n") ==
        "data: {\"id\":\"c\",\"created\":1}\n\n");
  CHECK(crlf.resumable());
  CHECK(crlf.feed(": ping\n\n") == ": ping\n\n");
  CHECK(crlf.resumable());
  StreamSplice multi;  // a multi-line event passes as it came, and the stream is not resumable
  CHECK(multi.feed("event: x\ndata: 1\n\n") == "event: x\ndata: 1\n\n");
  CHECK(!multi.resumable());
  StreamSplice unframed;  // no boundary for over 1 MiB: passed through
  const std::string big((1 << 20) + 10, 'x');
  CHECK(unframed.feed(big) == big);
  CHECK(!unframed.resumable());
  StreamSplice tail;
  CHECK(tail.feed("data: [DONE]").empty());
  CHECK(tail.finish() == "data: [DONE]");
}

TEST_CASE("splice: the resume body is the client's request plus kvfleet_resume") {
  StreamSplice s;
  s.feed(chunk("a", "5,6") + chunk("b", "7"));
  const boost::json::object client{{"model", "m"}, {"prompt", "Hi"}, {"stream", true}, {"seed", 3}};
  const boost::json::value body = boost::json::parse(s.resume_body(client));
  CHECK(body.at("prompt") == "Hi");
  CHECK(body.at("seed") == 3);
  CHECK(body.at("kvfleet_resume") ==
        boost::json::parse(R"({"output_token_ids":[5,6,7],"id":"cmpl-7","created":42})"));
}
