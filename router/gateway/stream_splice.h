// StreamSplice: one streamed choice on its way from replicas to the client, kept so that it can be
// resumed on another replica when its replica dies or stalls mid-stream (docs/router.md, "Mid-stream
// failover").
//
// The router asks the replica for the token ids behind each chunk (X-Kvfleet-Token-Ids: true); each
// chunk then ends with `,"kvfleet_token_ids":[...]}` (Contract 4). The splice cuts the replica's bytes
// into SSE events, takes each chunk's ids off (the client never sees them) and keeps them, and passes
// only whole events to the client: a replica that breaks mid-event leaves nothing half-written. The
// first chunk gives the stream's id and created, which a resumed replica continues under.
//
// A stream stays resumable while every chunk carried its ids and it has not ended (no finish_reason,
// no error event, no [DONE]). A stream that is not (a replica that does not speak the extension, odd
// framing) passes through unchanged and fails over as before: an error event.
//
// Not thread-safe: one per request, used by the coroutine that relays it.
#pragma once

#include <boost/json/object.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet::router {

class StreamSplice {
 public:
  // Bytes of the current replica's stream; returns what may go to the client now (whole events).
  std::string feed(std::string_view bytes);
  // The current replica's stream broke or stalled: its unfinished event is dropped. What was passed on
  // stands; a resumed stream's events continue it.
  void drop_partial() { pending_.clear(); }
  // The current replica's stream ended cleanly: whatever is left (a last event without its blank line).
  std::string finish();

  bool resumable() const { return resumable_ && !ended_; }
  bool started() const { return !id_.empty(); }  // a chunk reached the client
  bool ended() const { return ended_; }          // [DONE], an error event or a finish_reason passed
  const std::vector<TokenId>& output_ids() const { return ids_; }
  const std::string& id() const { return id_; }
  std::int64_t created() const { return created_; }

  // The resume request's body: the client's request with kvfleet_resume (the ids streamed so far, the
  // stream's id and created) added.
  std::string resume_body(const boost::json::object& client_body) const;

 private:
  // One whole event (without its blank line); returns it as the client gets it.
  std::string take_event(std::string_view event);
  void note_chunk(std::string_view json);

  std::string pending_;  // an event not complete yet
  std::vector<TokenId> ids_;
  std::string id_;
  std::int64_t created_ = 0;
  bool resumable_ = true;
  bool ended_ = false;
};

}  // namespace kvfleet::router
