// kvfleet perplexity: mean negative log-likelihood and perplexity of a text file under a model, in
// windows of --context tokens (see kvfleet/perplexity.h for exactly what is scored). Prints one JSON object.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/cli/common.h"
#include "kvfleet/perplexity.h"
#include "kvfleet/tokenizer.h"

namespace kvfleet::cli {

void register_perplexity(CLI::App& app) {
  struct Args {
    std::string model, file;
    std::int64_t context = 256;
    BackendOptions backend;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a text file, in windows of --context tokens");
  cmd->add_option("--model", a->model, "Hugging Face model directory (with tokenizer.json)")->required();
  cmd->add_option("--file", a->file, "UTF-8 text file; encoded without special tokens")->required();
  cmd->add_option("--context", a->context, "window length in tokens")->capture_default_str();
  add_backend_options(*cmd, a->backend);
  cmd->callback([a] {
    std::ifstream in(a->file, std::ios::binary);
    if (!in) throw std::invalid_argument(a->file + ": cannot read");
    std::ostringstream text;
    text << in.rdbuf();
    const Model model = Model::load(a->model);
    const Tokenizer tok = Tokenizer::load(a->model);
    const auto ids = tok.encode(text.str(), false);
    auto backend = make_backend(a->backend);
    const PerplexityResult r = window_perplexity(model, *backend, ids, a->context);
    std::printf("{\"tokens\": %zu, \"context\": %lld, \"windows\": %lld, \"tokens_scored\": %lld, "
                "\"mean_nll\": %.9g, \"perplexity\": %.9g}\n",
                ids.size(), static_cast<long long>(a->context), static_cast<long long>(r.windows),
                static_cast<long long>(r.tokens_scored), r.mean_nll(), r.perplexity());
  });
}

}  // namespace kvfleet::cli
