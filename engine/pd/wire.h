// The KV transfer wire format (DESIGN.md Contract 3): self-delimiting, checksummed frames.
//
//   frame   = magic "KVF1" (4) | type (1) | 0 (3) | payload length (u32 LE) | payload | XXH3-64 (u64 LE)
//             of everything before it (header and payload)
//   hello   D -> P  body of POST /internal/prefill: protocol version, D's KvLayout and compat hash, the
//                   transports D speaks, the prompt tokens of the full blocks D wants, the hashes of the
//                   leading blocks D already holds (not sent again), the lease D asks for
//   accept  P -> D  the answer: P's layout and hash, the transport chosen, transfer id, lease, the block
//                   range P will serve [first_block, first_block + num_blocks) and their hashes, then
//                   (optional, ucx) the host and port to pull from
//   block   P -> D  one block: index, hash, layer range [layer_begin, layer_end), payload of those layers
//                   in Contract 5's layout (per layer K then V, [kv_heads][block_size][head_dim], kv dtype)
//   end     P -> D  closes a pull: blocks and payload bytes sent in it
//   error   P -> D  ends a pull early: a code and a message
// Integers are little-endian; strings and lists carry a u32 count first. A decoder fed bytes in any split
// yields whole frames only; bad magic, an oversized length, a checksum mismatch or a malformed payload
// throws WireError, and a stream that ends inside a frame is truncated (FrameDecoder::partial()).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/pd/layout.h"

namespace kvfleet::pd {

inline constexpr std::uint16_t kProtocolVersion = 1;

enum class FrameType : std::uint8_t { hello = 1, accept = 2, block = 3, end = 4, error = 5 };

struct Hello {
  std::uint16_t version = kProtocolVersion;
  KvLayout layout;
  std::uint64_t compat_hash = 0;
  std::vector<std::string> transports{"tcp"};
  std::vector<TokenId> tokens;     // whole blocks only
  std::vector<BlockHash> held;     // hashes of the first held.size() blocks, which D has
  std::uint32_t lease_ms = 0;      // 0: P's default
  // The request's cache_salt (Contract 1): P computes and serves the blocks under the salted root, as D
  // hashes them. Encoded after lease_ms only when not empty (additive: an unsalted hello is unchanged).
  std::string cache_salt;
};

struct Accept {
  KvLayout layout;
  std::uint64_t compat_hash = 0;
  std::string transport = "tcp";
  std::uint64_t transfer_id = 0;
  std::uint32_t lease_ms = 0;
  std::uint32_t first_block = 0;
  std::uint32_t num_blocks = 0;
  std::vector<BlockHash> hashes;  // of blocks first_block .. first_block + num_blocks - 1
  // Where D pulls with `transport` when it is not P's HTTP port (ucx: P's UCP listener). Empty host:
  // the host D reached P at. Encoded after the hashes only when transport_port != 0 (additive: an
  // accept without them decodes as before).
  std::string transport_host;
  std::uint16_t transport_port = 0;
};

struct BlockFrame {
  std::uint32_t index = 0;
  BlockHash hash = 0;
  std::uint16_t layer_begin = 0, layer_end = 0;
  std::string payload;
};

struct End {
  std::uint32_t num_blocks = 0;
  std::uint64_t payload_bytes = 0;
};

enum class ErrorCode : std::uint16_t { internal = 1, lease_expired = 2, unknown_transfer = 3, bad_range = 4 };

struct ErrorFrame {
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

using Frame = std::variant<Hello, Accept, BlockFrame, End, ErrorFrame>;

struct WireError : std::runtime_error {
  enum class Kind { malformed, checksum, too_large };
  WireError(Kind k, const std::string& what) : std::runtime_error(what), kind(k) {}
  Kind kind;
};

inline constexpr std::size_t kFrameHeaderBytes = 12, kFrameTrailerBytes = 8;

std::string encode(const Frame& frame);
// A block frame straight from bytes (no copy into a BlockFrame first).
std::string encode_block(std::uint32_t index, BlockHash hash, std::uint16_t layer_begin, std::uint16_t layer_end,
                         std::string_view payload);

// Block frames laid out in place (P writes KV straight into a batch of frames, D checks and imports them
// where they were received): a block frame of `payload_bytes` is block_frame_bytes() long, its payload
// starts kBlockPayloadOffset bytes in.
inline constexpr std::size_t kBlockFieldsBytes = 4 + 8 + 2 + 2 + 4;
inline constexpr std::size_t kBlockPayloadOffset = kFrameHeaderBytes + kBlockFieldsBytes;
constexpr std::size_t block_frame_bytes(std::size_t payload_bytes) {
  return kBlockPayloadOffset + payload_bytes + kFrameTrailerBytes;
}
// Writes a block frame's header and fields at `frame` (block_frame_bytes(payload_bytes) bytes of room).
void put_block_header(char* frame, std::uint32_t index, BlockHash hash, std::uint16_t layer_begin,
                      std::uint16_t layer_end, std::size_t payload_bytes);
// Writes the checksum trailer of the frame of `total` bytes at `frame` (header and payload in place).
void seal_frame(char* frame, std::size_t total);
// The checksum of a frame whose header and payload lie in pieces, in order (P sends a block frame as its
// header, the block's layers straight from the KV cache and the trailer: one XXH3 pass, no copy). Equal to
// what seal_frame writes for the same bytes laid out back to back.
std::uint64_t frame_checksum(std::span<const std::string_view> pieces);

// A frame checked in place: the checksum holds; `payload` points into the caller's bytes.
struct FrameView {
  FrameType type = FrameType::error;
  std::string_view payload;
  std::size_t size = 0;  // the whole frame's bytes
};
// The frame at the start of `in`, or nullopt until all its bytes are there. Throws WireError (bad magic,
// a payload over max_payload, a checksum mismatch).
std::optional<FrameView> peek_frame(std::string_view in, std::size_t max_payload);
// A block frame's fields with the payload in place. Throws WireError when malformed.
struct BlockView {
  std::uint32_t index = 0;
  BlockHash hash = 0;
  std::uint16_t layer_begin = 0, layer_end = 0;
  std::string_view payload;
};
BlockView parse_block(std::string_view payload);
// Any frame, parsed (and copied) out of a view. Throws WireError.
Frame parse_frame(const FrameView& view);

class FrameDecoder {
 public:
  explicit FrameDecoder(std::size_t max_payload_bytes = 64u << 20) : max_payload_(max_payload_bytes) {}
  void feed(std::string_view bytes) { buffer_.append(bytes); }
  // The next whole frame, or nullopt until more bytes come. Throws WireError.
  std::optional<Frame> next();
  // Bytes of an unfinished frame are buffered: a stream that ends now was truncated.
  bool partial() const { return buffer_.size() > offset_; }

 private:
  std::string buffer_;
  std::size_t offset_ = 0;
  std::size_t max_payload_;
};

// Decodes exactly one frame filling `bytes` (an HTTP body). Throws WireError.
Frame decode_one(std::string_view bytes);

}  // namespace kvfleet::pd
