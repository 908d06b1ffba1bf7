// The ncclUniqueId exchange of an NCCL group through the TCP store (tcp_store.h), kept apart from NCCL so
// that it is testable on a machine without GPUs: rank 0 makes the id and publishes it under `key`, every
// other rank waits for it (the store client's timeout). The id is opaque bytes of a fixed size.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "engine/comm/tcp_store.h"

namespace kvfleet::comm {

// Rank 0: make() (must return `bytes` bytes), published, returned. Other ranks: the published bytes.
// Throws CommunicatorError when the key does not appear in time or holds another size.
std::vector<char> share_unique_id(TcpStoreClient& store, int rank, const std::string& key, std::size_t bytes,
                                  const std::function<std::vector<char>()>& make);

}  // namespace kvfleet::comm
