#include "engine/comm/nccl_rendezvous.h"

#include "kvfleet/communicator.h"

namespace kvfleet::comm {

std::vector<char> share_unique_id(TcpStoreClient& store, int rank, const std::string& key, std::size_t bytes,
                                  const std::function<std::vector<char>()>& make) {
  if (rank == 0) {
    std::vector<char> id = make();
    if (id.size() != bytes)
      throw CommunicatorError("unique id for '" + key + "': made " + std::to_string(id.size()) + " bytes, expected " +
                              std::to_string(bytes));
    store.set(key, id);
    return id;
  }
  std::vector<char> id = store.get(key);  // waits for rank 0, up to the client's timeout
  if (id.size() != bytes)
    throw CommunicatorError("unique id under '" + key + "' has " + std::to_string(id.size()) + " bytes, expected " +
                            std::to_string(bytes) + " (another program on the master port?)");
  return id;
}

}  // namespace kvfleet::comm
