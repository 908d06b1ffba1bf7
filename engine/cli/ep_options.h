// The flags that make a kvfleet command one rank of an expert-parallel group in its own process (Gloo):
// --ep-rank R --ep-master HOST:PORT [--ep-bind HOST] [--ep-timeout-ms MS], with --ep-size N.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "kvfleet/communicator.h"

namespace kvfleet::cli {

struct EpProcessOptions {
  int rank = -1;  // -1: ranks in process (threads)
  std::string master, bind;
  int timeout_ms = 30000;
  bool over_processes() const { return rank >= 0; }
};

void add_ep_process_options(CLI::App& cmd, EpProcessOptions& options);

// This process's rank of an ep_size group over Gloo (blocks until all ranks joined). Throws
// std::invalid_argument for inconsistent flags.
std::unique_ptr<Communicator> connect_ep_rank(int ep_size, const EpProcessOptions& options);

}  // namespace kvfleet::cli
