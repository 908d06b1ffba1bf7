// kvfleet: the offline tools. Each subcommand lives in its own cmd_*.cpp and registers itself here.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

namespace kvfleet::cli {
void register_make_model(CLI::App& app);
void register_logits(CLI::App& app);
void register_generate(CLI::App& app);
void register_inspect(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_detokenize(CLI::App& app);
void register_perplexity(CLI::App& app);
}  // namespace kvfleet::cli

int main(int argc, char** argv) {
  CLI::App app{"kvfleet: offline tools (make-model, logits, generate, inspect)"};
  app.require_subcommand(1);
  kvfleet::cli::register_make_model(app);
  kvfleet::cli::register_logits(app);
  kvfleet::cli::register_generate(app);
  kvfleet::cli::register_inspect(app);
  kvfleet::cli::register_tokenize(app);
  kvfleet::cli::register_detokenize(app);
  kvfleet::cli::register_perplexity(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfleet: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
