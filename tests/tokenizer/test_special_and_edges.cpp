// Exact-outcome tests: known ids, special tokens, add_special_tokens, empty / invalid / 1 MB input,
// vocab queries and concurrent use of one Tokenizer.
#include <doctest/doctest.h>

#include "tests/tokenizer/fixtures.h"

#include <stdexcept>
#include <thread>

namespace kvfleet::test {
using Ids = std::vector<TokenId>;

TEST_CASE("known ids from the references") {
  CHECK(shared_tokenizer("gpt2").encode("Hello world") == Ids{15496, 995});
  CHECK(shared_tokenizer("cl100k").encode("Hello world <|endoftext|>") == Ids{9906, 1917, 220, 100257});
  // Llama-2's Prepend normalizer runs per section, so the text after <s> gets its own U+2581.
  CHECK(shared_tokenizer("llama2").encode("Hello world <s> ok") == Ids{1, 22557, 1526, 28705, 1, 28705, 3614});
}

TEST_CASE("special tokens are matched before the model and can be skipped when decoding") {
  const Tokenizer& qwen = shared_tokenizer("qwen3");
  const Ids ids = qwen.encode("<|im_start|>user\nHi<|im_end|>");
  REQUIRE(ids.size() >= 4);
  CHECK(ids.front() == 151644);
  CHECK(ids.back() == 151645);
  CHECK(qwen.is_special(151644));
  CHECK_FALSE(qwen.is_special(ids[1]));
  CHECK(qwen.decode(ids) == "<|im_start|>user\nHi<|im_end|>");
  CHECK(qwen.decode(ids, true) == "user\nHi");
  CHECK(qwen.token_to_id("<|im_end|>") == 151645);
  CHECK(qwen.id_to_token(151645) == "<|im_end|>");
  CHECK(qwen.id_to_token(-1) == std::nullopt);
  CHECK(qwen.vocab_size() == 151669);
  CHECK(qwen.bos_id() == std::nullopt);
  CHECK(qwen.eos_ids() == Ids{151645});
}

TEST_CASE("add_special_tokens controls the BOS the post-processor adds") {
  const Tokenizer& llama3 = shared_tokenizer("llama3_1");
  CHECK(llama3.bos_id() == 128000);
  CHECK(llama3.eos_ids() == Ids{128009});
  const Ids with = llama3.encode("Hello");
  const Ids without = llama3.encode("Hello", false);
  CHECK(with == Ids{128000, 9906});
  CHECK(without == Ids{9906});
  // A BOS written in the text is still recognised without add_special_tokens.
  CHECK(llama3.encode("<|begin_of_text|>Hello", false) == Ids{128000, 9906});
  const Tokenizer& llama2 = shared_tokenizer("llama2");
  CHECK(llama2.encode("Hello", true).front() == 1);
  CHECK(llama2.encode("Hello", false).front() != 1);
  CHECK(llama2.decode(llama2.encode("Hello world"), true) == "Hello world");
}

TEST_CASE("empty input") {
  CHECK(shared_tokenizer("qwen3").encode("").empty());
  CHECK(shared_tokenizer("gpt2").encode("", false).empty());
  CHECK(shared_tokenizer("llama3_1").encode("") == Ids{128000});
  CHECK(shared_tokenizer("llama2").encode("", false).empty());
  CHECK(shared_tokenizer("qwen3").decode(Ids{}).empty());
}

TEST_CASE("invalid UTF-8 is rejected with std::invalid_argument naming the offset") {
  const Tokenizer& gpt2 = shared_tokenizer("gpt2");
  for (const std::string& bad : {std::string("\xff"), std::string("abc\xc3"), std::string("\xed\xa0\x80"),
                                std::string("\xc0\xaf"), std::string("ok\xf4\x90\x80\x80")}) {
    CHECK_THROWS_WITH_AS(gpt2.encode(bad), doctest::Contains("not valid UTF-8"), std::invalid_argument);
  }
  CHECK_THROWS_WITH_AS(gpt2.encode("abc\xc3"), doctest::Contains("byte offset 3"), std::invalid_argument);
  CHECK_THROWS_AS(shared_tokenizer("llama2").encode("x\x80"), std::invalid_argument);
}

TEST_CASE("an out-of-range id decodes to nothing, as in Hugging Face (padded embedding rows)") {
  const Tokenizer& gpt2 = shared_tokenizer("gpt2");
  CHECK(gpt2.decode(Ids{15496, 50257}) == gpt2.decode(Ids{15496}));
  CHECK(gpt2.decode(Ids{-1}).empty());
  StreamDecoder stream(gpt2);
  CHECK(stream.push(1 << 30).empty());
  CHECK(stream.push(-5).empty());
  CHECK(stream.push(15496) + stream.flush() == gpt2.decode(Ids{15496}));
}

TEST_CASE("1 MB inputs: one huge word, a run of spaces, mixed text") {
  const std::string letters(1 << 20, 'a');
  const std::string spaces(1 << 20, ' ');
  std::string mixed;
  for (const auto& text : reference("gpt2").texts) {
    if (mixed.size() > (1 << 20)) break;
    mixed += text + "\n";
  }
  for (const std::string model : {"gpt2", "llama3_1", "llama2", "qwen3"}) {
    CAPTURE(model);
    const Tokenizer& tk = shared_tokenizer(model);
    for (const std::string* text : std::vector<const std::string*>{&letters, &spaces, &mixed}) {
      const Ids ids = tk.encode(*text, false);
      CHECK(!ids.empty());
      CHECK(ids.size() <= text->size());
    }
  }
  const Tokenizer& gpt2 = shared_tokenizer("gpt2");
  CHECK(gpt2.decode(gpt2.encode(letters)) == letters);
  CHECK(gpt2.decode(gpt2.encode(spaces)) == spaces);
  CHECK(gpt2.decode(gpt2.encode(mixed)) == mixed);
}

TEST_CASE("one const Tokenizer encodes and decodes from several threads at once") {
  const Tokenizer& tk = shared_tokenizer("llama3_1");
  const auto& texts = reference("llama3_1").texts;
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(tk.encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (std::size_t i = 0; i < texts.size(); ++i) {
          const std::size_t k = (i * 7 + static_cast<std::size_t>(t) * 13) % texts.size();
          const Ids ids = tk.encode(texts[k]);
          if (ids != expected[k] || tk.decode(ids, true) != tk.decode(expected[k], true)) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("load errors name the path") {
  CHECK_THROWS_WITH_AS(Tokenizer::load("/nonexistent/tokenizer.json"), doctest::Contains("/nonexistent"),
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(Tokenizer::load(source_dir() / "tests"), doctest::Contains("neither tokenizer.json"),
                       std::runtime_error);
}

}  // namespace kvfleet::test
