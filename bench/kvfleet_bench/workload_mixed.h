// The mixed-chat workload (the prefill/decode comparison): short chat turns, with long prompts
// among them that stall every running decode while they prefill on the same replica. Each request is
// one chain; a fraction --mixed-long-fraction of them (placed at random) has --mixed-long-input-len prompt
// tokens, the rest --mixed-short-input-len; all get --random-output-len output tokens (with
// --random-range-ratio applied to every length). Chain::group tells them apart: 0 short, 1 long.
#pragma once

#include <random>

#include "bench/kvfleet_bench/workload.h"

namespace CLI {
class App;
}

namespace kvfleet::bench {

inline constexpr int kShortChatGroup = 0, kLongPromptGroup = 1;

Workload mixed_chat_workload(const WorkloadOptions& options, const PromptBuilder& prompts, std::mt19937_64& rng);

void add_mixed_chat_flags(CLI::App& app, WorkloadOptions& options);

}  // namespace kvfleet::bench
