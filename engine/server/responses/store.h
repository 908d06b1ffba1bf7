// The replica's stored responses (POST /v1/responses with store: true): GET and DELETE
// /v1/responses/{id} read and remove them, previous_response_id continues from one, an item_reference
// names one of their items. In memory, bounded by entries and by bytes; the least recently used goes
// first. A restart forgets everything.
//
// Thread-safety: every member may be called from any thread (one mutex, held for map work only).
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kvfleet::server {

struct StoredResponse {
  boost::json::object response;      // the response object, as GET returns it
  boost::json::array conversation;   // its input items then its output items (not its instructions)
};

class ResponseStore {
 public:
  struct Limits {
    std::size_t max_entries = 10000;
    std::size_t max_bytes = std::size_t{256} << 20;  // serialized JSON of the responses and conversations
  };
  explicit ResponseStore(Limits limits) : limits_(limits) {}

  // Stores (or replaces) `id`, evicting the least recently used until both bounds hold. An entry larger
  // than max_bytes on its own is not kept: returns false.
  bool put(const std::string& id, StoredResponse entry);
  // The entry (null: unknown or evicted); counts as a use.
  std::shared_ptr<const StoredResponse> get(std::string_view id);
  bool erase(std::string_view id);
  // An item of a stored conversation by its own id ("msg_...", "fc_..."), for item_reference; a copy.
  std::optional<boost::json::object> find_item(std::string_view item_id);

  std::size_t size() const;
  std::size_t bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> value;
    std::size_t bytes = 0;
    std::list<std::string>::iterator lru;  // its place in lru_ (front: most recent)
  };
  void erase_locked(std::unordered_map<std::string, Entry>::iterator it);

  const Limits limits_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  std::unordered_map<std::string, std::string> items_;  // item id -> the response id that holds it
  std::list<std::string> lru_;
  std::size_t bytes_ = 0;
};

}  // namespace kvfleet::server
