// Connection caps: what a new connection costs when the server or its client address is full.
//
// A cap reached by half-requests (connections that have not finished a request head: slowloris, idle
// keep-alive) must not lock other clients out, and refusing the newest connection is what a slowloris
// wants: it reopens at once and keeps the old ones. So past a cap the new connection is admitted and
// the half-request with the oldest activity closes instead: one of the same address when the address is
// at max_connections_per_peer, one of the address holding the most connections when the server is at
// max_connections. Connections reading a body or being served are never closed for a newcomer; with
// none to close, the newcomer goes to the probe reserve (priority paths only) or is refused.
#include <algorithm>
#include <limits>

#include "session.h"

namespace kvfleet::http {

size_t HttpServerConfig::peer_cap() const {
  if (max_connections_per_peer) return *max_connections_per_peer;
  return std::max<size_t>(1, max_connections / 2);
}

std::chrono::milliseconds HttpServerConfig::effective_header_timeout() const {
  if (header_timeout.count() > 0) return header_timeout;
  return std::min(read_timeout, std::chrono::milliseconds{10'000});
}

bool HttpServerConfig::is_priority_path(std::string_view target) const {
  const std::string_view path = target.substr(0, target.find('?'));
  for (const std::string& p : priority_paths) {
    if (!p.empty() && p.back() == '/' ? path.starts_with(p) : path == p) return true;
  }
  return false;
}

namespace {

// The half-request among `members` whose last activity is oldest; null when none is one.
ActivitySlot* idlest_half_request(const std::vector<ActivitySlot*>& members) {
  ActivitySlot* idlest = nullptr;
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (ActivitySlot* s : members) {
    if (!s->half_request.load(std::memory_order_relaxed)) continue;
    const int64_t at = s->last_active.load(std::memory_order_relaxed);
    if (at < oldest) {
      oldest = at;
      idlest = s;
    }
  }
  return idlest;
}

void remove_member(std::unordered_map<std::string, std::vector<ActivitySlot*>>& per_peer, const std::string& peer,
                   ActivitySlot* slot) {
  auto members = per_peer.find(peer);
  if (members == per_peer.end()) return;
  std::vector<ActivitySlot*>& list = members->second;
  ActivitySlot* last = list.back();
  list[slot->peer_index] = last;
  last->peer_index = slot->peer_index;
  list.pop_back();
  if (list.empty()) per_peer.erase(members);
}

}  // namespace

HttpServer::State::Admission HttpServer::State::add_session(Session* session, std::weak_ptr<Session> weak,
                                                            std::string peer, std::shared_ptr<Session>& victim,
                                                            ActivitySlot*& slot) {
  std::lock_guard lock(mutex);
  const size_t peer_cap = config.peer_cap();
  auto uncount = [&](ActivitySlot* s) {
    auto it = sessions.find(s->session);
    remove_member(per_peer, it->second.peer, s);
    it->second.counted = false;
    --counted;
    victim = it->second.session.lock();
  };
  bool full = false;
  auto mine = per_peer.find(peer);
  if (peer_cap > 0 && !peer.empty() && mine != per_peer.end() && mine->second.size() >= peer_cap) {
    if (ActivitySlot* s = idlest_half_request(mine->second)) {
      uncount(s);
    } else {
      full = true;
    }
  }
  if (!full && counted >= config.max_connections) {
    // The address with the most connections gives one up (addresses are few next to connections).
    const std::vector<ActivitySlot*>* heaviest = nullptr;
    for (const auto& [address, members] : per_peer) {
      if (!heaviest || members.size() > heaviest->size()) heaviest = &members;
    }
    ActivitySlot* s = heaviest ? idlest_half_request(*heaviest) : nullptr;
    if (s && !victim) {
      uncount(s);
    } else {
      full = true;
    }
  }
  if (full && probe_only >= config.probe_reserve) return Admission::refused;
  if (free_slots.empty()) {
    slot = &slots.emplace_back();
  } else {
    slot = free_slots.back();
    free_slots.pop_back();
  }
  slot->session = session;
  slot->half_request.store(true, std::memory_order_relaxed);
  slot->last_active.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  if (full) {
    ++probe_only;
    sessions.emplace(session, Entry{std::move(weak), std::move(peer), slot, false, true});
    return Admission::probe_only;
  }
  if (!peer.empty()) {
    std::vector<ActivitySlot*>& members = per_peer[peer];
    slot->peer_index = members.size();
    members.push_back(slot);
  }
  ++counted;
  sessions.emplace(session, Entry{std::move(weak), std::move(peer), slot, true, false});
  return Admission::admitted;
}

void HttpServer::State::remove_session(Session* session) {
  std::lock_guard lock(mutex);
  auto it = sessions.find(session);
  if (it == sessions.end()) return;
  if (it->second.counted) {
    --counted;
    if (!it->second.peer.empty()) remove_member(per_peer, it->second.peer, it->second.slot);
  } else if (it->second.probe_only) {
    --probe_only;
  }
  it->second.slot->session = nullptr;
  free_slots.push_back(it->second.slot);
  sessions.erase(it);
  if (sessions.empty()) sessions_empty.notify_all();
}

}  // namespace kvfleet::http
