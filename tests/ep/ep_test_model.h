// The tiny Mixtral and the engine settings the EpGroup tests share (test_ep_group, test_ep_per_rank_events).
#pragma once

#include <cstdint>

#include "kvfleet/engine.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model.h"
#include "support/temp_dir.h"

namespace kvfleet::test {

inline Model tiny_moe(const TempDir& dir) {
  MakeModelOptions o;
  o.arch = "mixtral";
  o.dtype = DType::bf16;
  o.vocab = 300;
  o.experts = 4;
  o.experts_per_tok = 2;
  make_model(o, dir.path());
  return Model::load(dir.path());
}

inline EngineConfig ep_config(std::int32_t blocks) {
  EngineConfig c;
  c.num_blocks = blocks;
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.max_num_seqs = 8;
  c.backend.kind = "cpu";
  c.backend.threads = 1;
  return c;
}

}  // namespace kvfleet::test
