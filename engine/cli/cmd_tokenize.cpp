// `kvfleet tokenize` and `kvfleet detokenize`: the tokenizer from the command line.
//   kvfleet tokenize --tokenizer PATH [--file F] [--no-special]   -> [1,2,3]
//   kvfleet detokenize --tokenizer PATH --ids 1,2,3 [--skip-special] -> text
#include <CLI/CLI.hpp>

#include "kvfleet/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace kvfleet::cli {
namespace {

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<TokenId> parse_ids(const std::string& text) {
  std::vector<TokenId> ids;
  std::string token;
  std::istringstream in(text);
  // Accepts "1,2,3", "1 2 3" and "[1, 2, 3]".
  for (char c; in.get(c);) {
    if (c >= '0' && c <= '9') {
      token.push_back(c);
      continue;
    }
    if (c == '-' && token.empty()) throw std::invalid_argument("token ids cannot be negative");
    if (c != ',' && c != ' ' && c != '[' && c != ']' && c != '\n' && c != '\t') {
      throw std::invalid_argument(std::string("unexpected '") + c + "' in --ids");
    }
    if (!token.empty()) ids.push_back(static_cast<TokenId>(std::stol(token)));
    token.clear();
  }
  if (!token.empty()) ids.push_back(static_cast<TokenId>(std::stol(token)));
  return ids;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer;
    std::string file;
    bool no_special = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("--tokenizer", opts->tokenizer, "tokenizer.json or a model directory")->required();
  cmd->add_option("--file", opts->file, "read the text from this file (default: stdin)");
  cmd->add_flag("--no-special", opts->no_special, "do not add BOS/EOS (add_special_tokens = false)");
  cmd->callback([opts] {
    const Tokenizer tokenizer = Tokenizer::load(opts->tokenizer);
    std::string text;
    if (opts->file.empty()) {
      text = read_all(std::cin);
    } else {
      std::ifstream in(opts->file, std::ios::binary);
      if (!in) throw std::runtime_error("cannot open " + opts->file);
      text = read_all(in);
    }
    const std::vector<TokenId> ids = tokenizer.encode(text, !opts->no_special);
    std::string out = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) out.push_back(',');
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

void register_detokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer;
    std::string ids;
    bool skip_special = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("detokenize", "Print the text of a list of token ids");
  cmd->add_option("--tokenizer", opts->tokenizer, "tokenizer.json or a model directory")->required();
  cmd->add_option("--ids", opts->ids, "ids, e.g. 1,2,3")->required();
  cmd->add_flag("--skip-special", opts->skip_special, "leave special tokens out");
  cmd->callback([opts] {
    const Tokenizer tokenizer = Tokenizer::load(opts->tokenizer);
    const std::string text = tokenizer.decode(parse_ids(opts->ids), opts->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  });
}

}  // namespace kvfleet::cli
