// The flags that make a kvfleet command one rank of an expert-parallel group in its own process (Gloo or
// NCCL): --ep-rank R --ep-master HOST:PORT [--ep-bind HOST] [--ep-timeout-ms MS] [--ep-comm gloo|nccl|auto],
// with --ep-size N.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "kvfleet/backend.h"
#include "kvfleet/communicator.h"

namespace kvfleet::cli {

struct EpProcessOptions {
  int rank = -1;  // -1: ranks in process (threads)
  std::string master, bind;
  int timeout_ms = 30000;
  std::string comm = "auto";  // --ep-comm: gloo | nccl | auto (nccl for a CUDA rank in a build with NCCL)
  bool over_processes() const { return rank >= 0; }
};

void add_ep_process_options(CLI::App& cmd, EpProcessOptions& options);

// This process's rank of an ep_size group over Gloo or NCCL (blocks until all ranks joined). Throws
// std::invalid_argument for inconsistent flags. With NCCL, backend.device becomes the rank's GPU
// (rank % visible devices), the device the communicator uses.
std::unique_ptr<Communicator> connect_ep_rank(int ep_size, const EpProcessOptions& options, BackendOptions& backend);
// The same for an engine (kvfleet generate): its votes paced over a channel to rank 0, so that an idle
// group sleeps (engine/ep/paced_rank.h). Logits ranks need none: they only run forward passes.
std::unique_ptr<Communicator> connect_paced_ep_rank(int ep_size, const EpProcessOptions& options, BackendOptions& backend);

}  // namespace kvfleet::cli
