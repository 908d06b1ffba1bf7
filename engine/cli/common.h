// Helpers shared by the kvfleet subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "kvfleet/backend.h"
#include "kvfleet/block_hash.h"

namespace kvfleet::cli {

// "1,2,3" -> {1, 2, 3}; throws std::invalid_argument naming the bad item.
std::vector<TokenId> parse_ids(const std::string& text);

// Adds --backend and --threads to a subcommand.
void add_backend_options(CLI::App& cmd, BackendOptions& options);

}  // namespace kvfleet::cli
