#include "engine/server/responses/store.h"

#include <boost/json.hpp>

namespace kvfleet::server {
namespace json = boost::json;

namespace {

// The ids of a conversation's items that have one.
template <typename F>
void for_each_item_id(const json::array& conversation, F&& f) {
  for (const auto& item : conversation)
    if (item.is_object())
      if (const json::value* id = item.as_object().if_contains("id"); id && id->is_string()) f(std::string(id->as_string()));
}

}  // namespace

bool ResponseStore::put(const std::string& id, StoredResponse entry) {
  const std::size_t size = json::serialize(entry.response).size() + json::serialize(entry.conversation).size() + id.size();
  auto value = std::make_shared<const StoredResponse>(std::move(entry));
  std::lock_guard lock(mutex_);
  if (auto old = entries_.find(id); old != entries_.end()) erase_locked(old);
  if (size > limits_.max_bytes || limits_.max_entries == 0) return false;
  while (!lru_.empty() && (entries_.size() + 1 > limits_.max_entries || bytes_ + size > limits_.max_bytes))
    erase_locked(entries_.find(lru_.back()));
  lru_.push_front(id);
  entries_.emplace(id, Entry{value, size, lru_.begin()});
  bytes_ += size;
  for_each_item_id(value->conversation, [&](std::string item) { items_[std::move(item)] = id; });
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(std::string_view id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(std::string(id));
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.value;
}

bool ResponseStore::erase(std::string_view id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(std::string(id));
  if (it == entries_.end()) return false;
  erase_locked(it);
  return true;
}

std::optional<json::object> ResponseStore::find_item(std::string_view item_id) {
  std::shared_ptr<const StoredResponse> holder;
  {
    std::lock_guard lock(mutex_);
    auto item = items_.find(std::string(item_id));
    if (item == items_.end()) return std::nullopt;
    auto it = entries_.find(item->second);
    if (it == entries_.end()) return std::nullopt;
    holder = it->second.value;
  }
  for (const auto& item : holder->conversation)
    if (item.is_object())
      if (const json::value* id = item.as_object().if_contains("id"); id && id->is_string() && id->as_string() == item_id)
        return item.as_object();
  return std::nullopt;
}

void ResponseStore::erase_locked(std::unordered_map<std::string, Entry>::iterator it) {
  const std::string& id = it->first;
  for_each_item_id(it->second.value->conversation, [&](const std::string& item) {
    if (auto owner = items_.find(item); owner != items_.end() && owner->second == id) items_.erase(owner);
  });
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

std::size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::size_t ResponseStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace kvfleet::server
