// Which replica holds each stored response (POST /v1/responses with store), so that a follow-up naming it
// (previous_response_id) and GET / DELETE /v1/responses/{id} reach that replica: a replica's store is
// its own memory. The replica names the id of every response it stores in the `x-kvfleet-response-id`
// header of its answer (streamed or not), which the router reads from the head it relays anyway.
//
// Bounded (`max_entries`, least recently used out first). An id the map does not know (evicted, or
// answered through another router or before a restart) is looked for by asking the replicas
// (Gateway::find_response_owner), and remembered again.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvfleet::router {

class ResponseOwners {
 public:
  explicit ResponseOwners(std::size_t max_entries) : max_entries_(max_entries) {}

  void remember(const std::string& id, const std::string& replica_url);
  std::optional<std::string> find(std::string_view id);  // counts as a use
  void forget(std::string_view id);
  // A removed replica's responses are gone with it.
  void forget_replica(std::string_view replica_url);
  std::size_t size() const;

 private:
  struct Entry {
    std::string url;
    std::list<std::string>::iterator lru;
  };
  const std::size_t max_entries_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // front: most recent
};

}  // namespace kvfleet::router
