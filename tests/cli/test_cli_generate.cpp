// `kvfleet generate --prompts FILE.jsonl` from outside: the same outputs whatever the batching flags.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <fstream>
#include <map>

#include "support/tiny_qwen.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

std::map<std::string, std::string> run_generate(const test::TempDir& dir, const std::string& flags) {
  const auto r = test::run_command(test::bin_dir() + "/kvfleet generate --model " + (dir / "model").string() +
                                   " --prompts " + (dir / "prompts.jsonl").string() + " --backend cpu " + flags);
  REQUIRE(r.status == 0);
  std::map<std::string, std::string> by_id;  // id -> the whole output line, minus nothing
  std::size_t start = 0;
  while (start < r.out.size()) {
    const auto end = r.out.find('\n', start);
    const auto line = r.out.substr(start, end - start);
    const auto v = boost::json::parse(line);
    by_id[boost::json::serialize(v.at("id"))] = line;
    start = end + 1;
  }
  return by_id;
}

}  // namespace

TEST_CASE("generate --prompts: text and id prompts, stop strings, identical under every batching flag") {
  test::TempDir dir;
  test::make_tiny_qwen(dir / "model");
  {
    std::ofstream f(dir / "prompts.jsonl");
    f << R"({"id": "a", "prompt": "You are a helpful assistant. Tell me about the sea.", "max_tokens": 12})" << '\n'
      << R"({"id": "b", "prompt": "You are a helpful assistant. Tell me about the sky.", "max_tokens": 9, "temperature": 0.7, "seed": 3})" << '\n'
      << R"({"id": 3, "prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], "max_tokens": 5})" << '\n';
  }
  const auto base = run_generate(dir, "--ignore-eos");
  REQUIRE(base.size() == 3);
  for (const char* flags : {"--ignore-eos --max-num-seqs 1", "--ignore-eos --no-prefix-cache",
                            "--ignore-eos --max-batched-tokens 5", "--ignore-eos --num-blocks 6 --max-num-seqs 3"})
    CHECK_MESSAGE(run_generate(dir, flags) == base, flags);
  const auto a = boost::json::parse(base.at("\"a\""));
  CHECK(a.at("output_ids").as_array().size() == 12);
  CHECK(a.at("finish_reason") == "length");

  // Stop on a piece of a's own text: it ends there, with reason "stop".
  const std::string text(a.at("text").as_string());
  REQUIRE(text.size() >= 4);
  std::size_t at = text.size() / 2;  // one whole UTF-8 character from the middle
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
  const auto lead = static_cast<unsigned char>(text[at]);
  const std::string stop = text.substr(at, lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2);
  {
    std::ofstream f(dir / "prompts.jsonl");
    f << boost::json::serialize(boost::json::object{{"id", "s"}, {"prompt", "You are a helpful assistant. Tell me about the sea."},
                                                    {"max_tokens", 12}, {"stop", stop}})
      << '\n';
  }
  const auto s = boost::json::parse(run_generate(dir, "--ignore-eos").at("\"s\""));
  CHECK(s.at("finish_reason") == "stop");
  CHECK(s.at("output_ids").as_array().size() <= 12);
  const std::string stext(s.at("text").as_string());
  CHECK(stext.find(stop) != std::string::npos);
}
