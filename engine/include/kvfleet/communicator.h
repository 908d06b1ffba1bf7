// Collectives between the ranks of an expert-parallel group (DESIGN.md Contract 6). Every rank calls the
// same collectives in the same order; a call returns once every rank has made it (each call is also a
// barrier). Buffers are host memory.
// Thread-safety: one Communicator per rank, used by that rank's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvfleet {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Variable-count all-to-all: `send` holds size() pieces back to back, piece r (send_bytes[r] bytes) for
  // rank r. Returns what every rank sent to this one, back to back in source-rank order, with the size of
  // each piece in recv_bytes (resized to size()).
  virtual std::vector<std::uint8_t> all_to_all_v(const void* send, const std::vector<std::size_t>& send_bytes,
                                                 std::vector<std::size_t>& recv_bytes) = 0;
  // recv (size() * bytes) = every rank's `bytes` bytes of send, in rank order.
  virtual void all_gather(const void* send, std::size_t bytes, void* recv) = 0;
  virtual void barrier() = 0;
};

// `size` ranks in one process (ranks as threads): communicators[r] is rank r's.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size);

}  // namespace kvfleet
