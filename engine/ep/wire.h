// JSON bodies of the expert-parallel request channel (ep/channel.h): what rank 0 sends a remote rank
// (GenerationRequest) and what comes back (RequestOutput, EngineStats). Floats travel as their IEEE bits
// (a u32), so a remote rank samples with bit-identical parameters. Readers throw std::invalid_argument on a missing or
// mistyped member.
#pragma once

#include <boost/json.hpp>

#include "kvfleet/engine.h"
#include "kvfleet/scheduler.h"

namespace kvfleet::ep {

boost::json::object to_json(const GenerationRequest& r);
GenerationRequest request_from_json(const boost::json::object& o);

boost::json::object to_json(const RequestOutput& o);
RequestOutput output_from_json(const boost::json::object& o);

boost::json::object to_json(const EngineStats& s);
EngineStats stats_from_json(const boost::json::object& o);

// One engine's GET /internal/kv_state figures, taken on its engine thread (a KvTask): the integrity check
// ("ok" or the problem) and the block, pin and queue counts. A remote rank sends it as a query's answer.
boost::json::object kv_state_json(Scheduler& s);

}  // namespace kvfleet::ep
