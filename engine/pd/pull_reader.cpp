#include "engine/pd/pull_reader.h"

#include <boost/json.hpp>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <tuple>
#include <utility>

namespace kvfleet::pd {
using boost::asio::awaitable;

std::string error_code_of(const std::string& body) {
  boost::system::error_code ec;
  const auto v = boost::json::parse(body, ec);
  if (ec || !v.is_object()) return {};
  const auto* err = v.as_object().if_contains("error");
  if (!err || !err->is_object()) return {};
  const auto* code = err->as_object().if_contains("code");
  return code && code->is_string() ? std::string(code->as_string()) : std::string();
}

namespace {

// Spare receive buffers of finished pulls (at most kSpare of them, kSpareBytes in all), largest last.
class SpareBuffers {
 public:
  static SpareBuffers& instance() {
    static SpareBuffers pool;
    return pool;
  }
  // A spare of at least `bytes`, or an empty one.
  std::pair<std::unique_ptr<char[]>, std::size_t> take(std::size_t bytes) {
    std::lock_guard lock(mu_);
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if (it->second >= bytes) {
        auto out = std::move(*it);
        spare_.erase(it);
        held_ -= out.second;
        return out;
      }
    return {nullptr, 0};
  }
  void give(std::unique_ptr<char[]> buffer, std::size_t bytes) {
    std::lock_guard lock(mu_);
    if (!buffer || spare_.size() >= kSpare || held_ + bytes > kSpareBytes) return;  // freed
    held_ += bytes;
    const auto at = std::find_if(spare_.begin(), spare_.end(), [&](const auto& b) { return b.second >= bytes; });
    spare_.emplace(at, std::move(buffer), bytes);
  }

 private:
  static constexpr std::size_t kSpare = 8, kSpareBytes = std::size_t{256} << 20;
  std::mutex mu_;
  std::vector<std::pair<std::unique_ptr<char[]>, std::size_t>> spare_;
  std::size_t held_ = 0;
};

// Room after the pull's block frames for its end frame (or an error frame instead).
constexpr std::size_t kTailBytes = 16 * 1024;

// Checks a block frame against what D asked for; `got` blocks of the pull came before it.
void check_block(const BlockView& b, const KvLayout& layout, std::span<const BlockHash> hashes, std::uint32_t from,
                 std::uint32_t count, std::size_t got) {
  const std::uint32_t want = from + static_cast<std::uint32_t>(got);
  if (b.index != want || got >= count) throw PdFailure("malformed", "block " + std::to_string(b.index) + " out of order");
  if (b.hash != hashes[want]) throw PdFailure("malformed", "block " + std::to_string(want) + " carries another hash");
  if (b.layer_begin != 0 || b.layer_end != layout.num_layers || b.payload.size() != layout.block_bytes())
    throw PdFailure("malformed", "block " + std::to_string(want) + " has the wrong layer range or size");
}

// A frame that is not a block: an end frame closes the pull (true), an error frame throws.
bool check_other(const FrameView& v, std::size_t got, std::uint32_t count) {
  const Frame f = parse_frame(v);
  if (const auto* e = std::get_if<ErrorFrame>(&f))
    throw PdFailure(e->code == ErrorCode::lease_expired ? "lease_expired" : "error", "P: " + e->message);
  const auto* end = std::get_if<End>(&f);
  if (!end) throw PdFailure("malformed", "unexpected frame in a pull");
  if (end->num_blocks != got || got != count) throw PdFailure("malformed", "end frame after too few blocks");
  return true;
}

// The HTTP body of a pull as a ByteSource (HttpClient::read_some_into: 0 after the last chunk).
class HttpBodySource : public ByteSource {
 public:
  explicit HttpBodySource(http::HttpClient& c) : c_(c) {}
  awaitable<std::size_t> read_some_into(std::span<char> into) override { return c_.read_some_into(into); }
  awaitable<std::size_t> read_some_scattered(std::span<const std::span<char>> into) override {
    return c_.read_some_scattered(into);
  }

 private:
  http::HttpClient& c_;
};

}  // namespace

ReceivedPull::~ReceivedPull() { SpareBuffers::instance().give(std::move(bytes), capacity); }

std::shared_ptr<ReceivedPull> pull_buffer(const KvLayout& layout, std::uint32_t count, std::shared_ptr<ReceivedPull> reuse) {
  const std::size_t capacity = std::size_t{count} * block_frame_bytes(layout.block_bytes()) + kTailBytes;
  std::shared_ptr<ReceivedPull> pull = reuse ? std::move(reuse) : std::make_shared<ReceivedPull>();
  if (pull->capacity < capacity) {
    SpareBuffers::instance().give(std::move(pull->bytes), pull->capacity);
    std::tie(pull->bytes, pull->capacity) = SpareBuffers::instance().take(capacity);
  }
  if (!pull->bytes) {
    pull->bytes = std::make_unique_for_overwrite<char[]>(capacity);
    pull->capacity = capacity;
  }
  return pull;
}

namespace {

// Exactly n bytes from `in` into p (several reads), or PdFailure when the stream ends or the deadline passed.
awaitable<void> read_exact(ByteSource& in, char* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  while (n > 0) {
    const std::span<char> into(p, n);  // (named: GCC 12)
    const std::size_t got = co_await in.read_some_into(into);
    if (got == 0) throw PdFailure("peer_closed", "the stream ended inside a frame");
    if (std::chrono::steady_clock::now() > deadline) throw PdFailure("timeout", "the transfer took longer than its deadline");
    p += got, n -= got;
  }
}

// Fills every buffer of `parts` in order (scattered reads: a block's layers, its trailer and the next
// frame's header in as few reads as the socket allows), or PdFailure as read_exact.
awaitable<void> read_all(ByteSource& in, std::vector<std::span<char>>& parts, std::chrono::steady_clock::time_point deadline) {
  std::size_t first = 0;
  while (first < parts.size()) {
    const auto rest = std::span<const std::span<char>>(parts).subspan(first);  // (named: GCC 12)
    std::size_t got = co_await in.read_some_scattered(rest);
    if (got == 0) throw PdFailure("peer_closed", "the stream ended inside a frame");
    if (std::chrono::steady_clock::now() > deadline) throw PdFailure("timeout", "the transfer took longer than its deadline");
    for (; got > 0 && first < parts.size(); ++first) {
      if (got < parts[first].size()) {
        parts[first] = parts[first].subspan(got);
        break;
      }
      got -= parts[first].size();
    }
    while (first < parts.size() && parts[first].empty()) ++first;
  }
}

template <typename T>
T field_at(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A frame that is not a block frame, whose 12-byte header is in `head`: read whole (bounded) and handled
// as check_other does (an end frame closes the pull, an error frame throws).
awaitable<void> read_other(ByteSource& in, const char* head, std::size_t got, std::uint32_t count,
                           std::chrono::steady_clock::time_point deadline) {
  const auto length = field_at<std::uint32_t>(head + 8);
  if (length > kTailBytes) throw WireError(WireError::Kind::too_large, "frame of " + std::to_string(length) + " bytes");
  std::string frame(kFrameHeaderBytes + length + kFrameTrailerBytes, '\0');
  std::memcpy(frame.data(), head, kFrameHeaderBytes);
  co_await read_exact(in, frame.data() + kFrameHeaderBytes, length + kFrameTrailerBytes, deadline);
  const auto v = peek_frame(frame, kTailBytes);  // checksum, magic
  if (!v || v->size != frame.size()) throw WireError(WireError::Kind::malformed, "short frame");
  check_other(*v, got, count);
}

}  // namespace

awaitable<void> read_pull_frames_into(ByteSource& in, const KvLayout& layout, std::span<const BlockHash> hashes,
                                      std::uint32_t from, std::uint32_t count,
                                      std::chrono::steady_clock::time_point deadline, std::span<char* const> dst) {
  const auto layers = static_cast<std::size_t>(layout.num_layers);
  const std::size_t layer_bytes = layout.block_bytes() / layers;
  if (dst.size() != std::size_t{count} * layers) throw std::invalid_argument("read_pull_frames_into: a destination per layer");
  char head[kBlockPayloadOffset];
  char tail[kFrameTrailerBytes + kFrameHeaderBytes];  // a block's trailer, then the next frame's header
  std::vector<std::string_view> pieces(layers + 1);
  std::vector<std::span<char>> parts;
  co_await read_exact(in, head, kFrameHeaderBytes, deadline);
  for (std::size_t got = 0;; ++got) {
    if (std::memcmp(head, "KVF1", 4) != 0) throw WireError(WireError::Kind::malformed, "bad frame magic");
    if (static_cast<FrameType>(head[4]) != FrameType::block) {
      co_await read_other(in, head, got, count, deadline);  // the end frame (or an error frame: throws)
      break;
    }
    if (got >= count) throw PdFailure("malformed", "P sent more than the pull asked for");
    if (field_at<std::uint32_t>(head + 8) != kBlockFieldsBytes + layout.block_bytes())
      throw PdFailure("malformed", "block " + std::to_string(from + got) + " has the wrong layer range or size");
    co_await read_exact(in, head + kFrameHeaderBytes, kBlockFieldsBytes, deadline);
    pieces[0] = std::string_view(head, sizeof head);
    parts.clear();
    for (std::size_t l = 0; l < layers; ++l) {
      char* to = dst[got * layers + l];
      parts.emplace_back(to, layer_bytes);
      pieces[1 + l] = std::string_view(to, layer_bytes);
    }
    // Every frame is longer than a header, so the next one's can be read with this one's trailer.
    parts.emplace_back(tail, sizeof tail);
    co_await read_all(in, parts, deadline);
    if (frame_checksum(pieces) != field_at<std::uint64_t>(tail)) throw WireError(WireError::Kind::checksum, "frame checksum mismatch");
    BlockView b;
    const char* f = head + kFrameHeaderBytes;
    b.index = field_at<std::uint32_t>(f);
    b.hash = field_at<BlockHash>(f + 4);
    b.layer_begin = field_at<std::uint16_t>(f + 12);
    b.layer_end = field_at<std::uint16_t>(f + 14);
    if (field_at<std::uint32_t>(f + 16) != layout.block_bytes()) throw WireError(WireError::Kind::malformed, "block payload length");
    b.payload = std::string_view(dst[got * layers], layout.block_bytes());  // (its size only: the layers lie apart)
    check_block(b, layout, hashes, from, count, got);
    std::memcpy(head, tail + kFrameTrailerBytes, kFrameHeaderBytes);
  }
  // Read the answer to its end (HTTP: the last chunk), so the connection is ready for the next pull.
  char rest[64];
  if (co_await in.read_some_into(rest) != 0) throw PdFailure("malformed", "bytes after the end frame");
}

namespace {

// The pull's response head: anything but 200 ends the pull with P's error (`lease_expired` named as such).
awaitable<void> check_pull_head(http::HttpClient& c) {
  const http::ResponseHead head = co_await c.read_head();
  if (head.status != 200) {
    const std::string body = co_await c.read_body();
    const std::string code = error_code_of(body);
    throw PdFailure(code == "lease_expired" ? "lease_expired" : "error", "pull answered " + std::to_string(head.status) + ": " + body);
  }
}

}  // namespace

awaitable<void> read_pull_into(http::HttpClient& c, const KvLayout& layout, std::span<const BlockHash> hashes,
                               std::uint32_t from, std::uint32_t count, std::chrono::steady_clock::time_point deadline,
                               std::span<char* const> dst) {
  co_await check_pull_head(c);
  HttpBodySource body(c);
  co_await read_pull_frames_into(body, layout, hashes, from, count, deadline, dst);
}

awaitable<std::shared_ptr<ReceivedPull>> read_pull(http::HttpClient& c, const KvLayout& layout,
                                                   std::span<const BlockHash> hashes, std::uint32_t from,
                                                   std::uint32_t count, std::chrono::steady_clock::time_point deadline,
                                                   std::shared_ptr<ReceivedPull> reuse) {
  co_await check_pull_head(c);
  HttpBodySource body(c);
  co_return co_await read_pull_frames(body, layout, hashes, from, count, deadline, std::move(reuse));
}

awaitable<std::shared_ptr<ReceivedPull>> read_pull_frames(ByteSource& c, const KvLayout& layout,
                                                          std::span<const BlockHash> hashes, std::uint32_t from,
                                                          std::uint32_t count,
                                                          std::chrono::steady_clock::time_point deadline,
                                                          std::shared_ptr<ReceivedPull> reuse) {
  const std::size_t capacity = std::size_t{count} * block_frame_bytes(layout.block_bytes()) + kTailBytes;
  const std::size_t max_payload = kBlockFieldsBytes + layout.block_bytes() + kTailBytes;
  std::shared_ptr<ReceivedPull> pull = pull_buffer(layout, count, std::move(reuse));
  pull->blocks.clear();
  pull->blocks.reserve(count);
  char* const buf = pull->bytes.get();
  std::size_t filled = 0, parsed = 0;
  bool ended = false;
  while (!ended) {
    if (filled == capacity) throw PdFailure("malformed", "P sent more than the pull asked for");
    const std::size_t n = co_await c.read_some_into(std::span<char>(buf + filled, capacity - filled));
    if (n == 0) break;
    if (std::chrono::steady_clock::now() > deadline) throw PdFailure("timeout", "the transfer took longer than its deadline");
    filled += n;
    while (!ended) {
      const auto v = peek_frame(std::string_view(buf + parsed, filled - parsed), max_payload);
      if (!v) break;
      parsed += v->size;
      if (v->type != FrameType::block) {
        ended = check_other(*v, pull->blocks.size(), count);
        continue;
      }
      const BlockView b = parse_block(v->payload);
      check_block(b, layout, hashes, from, count, pull->blocks.size());
      pull->blocks.push_back(b);
    }
  }
  if (!ended) throw PdFailure("peer_closed", parsed < filled ? "the stream ended inside a frame" : "the stream ended early");
  if (parsed != filled) throw PdFailure("malformed", "bytes after the end frame");
  // Read the body to its end (the last chunk), so the connection is ready for the next pull.
  char rest[64];
  if (co_await c.read_some_into(rest) != 0) throw PdFailure("malformed", "bytes after the end frame");
  co_return pull;
}

}  // namespace kvfleet::pd
