// What the two KV transports (Contract 3: `tcp`, the HTTP pull, and `ucx`, engine/pd/ucx/) share, so
// that both move the SAME bytes through the SAME code: P produces a pull's frames once
// (PrefillService::serve_blocks) into a PullSink, and D checks and imports them once (read_pull_frames in
// pull_reader.h) from a ByteSource. Frames and checksums are identical on both transports; only the
// carrier differs (HTTP chunks over TCP, or length-prefixed pieces on a UCP stream).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvfleet::pd {

// Where P writes one pull's answer (block frames then an end frame, or an error frame). Each call is
// one piece (about 8 MiB of frames at most); false when the reader is gone (P then frees the lease).
class PullSink {
 public:
  virtual ~PullSink() = default;
  virtual boost::asio::awaitable<bool> write(std::string_view piece) = 0;
  // One piece gathered from several, in order (P sends a block frame as its header, its layers straight
  // from the KV cache and its trailer). The default joins them into one buffer (a copy) and writes that;
  // the HTTP sink overrides it with one gathered write (writev), no copy.
  virtual boost::asio::awaitable<bool> write_pieces(std::span<const std::string_view> pieces);
  virtual boost::asio::awaitable<bool> finish() = 0;  // the pull's answer is complete
};

// Where D reads one pull's answer from: like a socket, up to `into.size()` bytes per call, 0 at the end
// of the pull's answer. Throws (PdFailure, system_error) on I/O failure or a deadline.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual boost::asio::awaitable<std::size_t> read_some_into(std::span<char> into) = 0;
  // The same over several buffers filled in order (how many bytes in all). The default reads into the
  // first non-empty one; the HTTP body overrides it with one readv.
  virtual boost::asio::awaitable<std::size_t> read_some_scattered(std::span<const std::span<char>> into);
};

// The transports this build can speak, in D's default order of preference.
std::vector<std::string> built_transports();

// "ucx,tcp" -> {"ucx", "tcp"}; throws std::invalid_argument on an unknown or repeated name, or an
// empty list. `built` are the names accepted (a build without UCX refuses "ucx" with a clear message).
std::vector<std::string> parse_transports(std::string_view list, const std::vector<std::string>& built);

// P's pick: the first of D's transports (its preference order) that P offers; "" when none.
std::string pick_transport(const std::vector<std::string>& wanted, const std::vector<std::string>& offered);

}  // namespace kvfleet::pd
