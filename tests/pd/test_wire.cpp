// The KV transfer wire format (engine/pd/wire.h): round trips, frames split at every byte, and corrupt,
// truncated or forged input rejected with WireError, never a crash or an allocation the input asks for.
#include <doctest/doctest.h>

#include <xxhash.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <cstring>
#include <exception>

#include "engine/pd/decode_fetcher.h"
#include "engine/pd/wire.h"

using namespace kvfleet;
using namespace kvfleet::pd;

namespace {

KvLayout layout() {
  KvLayout l;
  l.model_name = "tiny-qwen";
  l.architecture = "qwen2";
  l.dtype = DType::bf16;
  l.kv_dtype = DType::f32;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 16;
  l.block_size = 16;
  l.root = block_hash_root("tiny-qwen");
  return l;
}

std::string payload(std::size_t n, char seed) {
  std::string p(n, '\0');
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<char>(seed + i * 7);
  return p;
}

}  // namespace

TEST_CASE("every frame type round-trips") {
  Hello h;
  h.layout = layout();
  h.compat_hash = compat_hash(h.layout);
  h.tokens = {1, 2, 3, 4};
  h.held = {11, 22};
  h.lease_ms = 1234;
  const auto hb = std::get<Hello>(decode_one(encode(h)));
  CHECK(hb.layout == h.layout);
  CHECK(hb.compat_hash == h.compat_hash);
  CHECK(hb.tokens == h.tokens);
  CHECK(hb.held == h.held);
  CHECK(hb.lease_ms == 1234);
  CHECK(hb.transports == std::vector<std::string>{"tcp"});
  CHECK(hb.cache_salt.empty());
  Hello salted = h;
  salted.cache_salt = "tenant-a";
  const std::string salted_bytes = encode(salted);
  CHECK(std::get<Hello>(decode_one(salted_bytes)).cache_salt == "tenant-a");
  CHECK(salted_bytes.size() == encode(h).size() + 4 + 8);  // the salt is a trailer; unsalted hellos are unchanged

  Accept a;
  a.layout = layout();
  a.transfer_id = 77;
  a.first_block = 2;
  a.num_blocks = 3;
  a.hashes = {5, 6, 7};
  const auto ab = std::get<Accept>(decode_one(encode(a)));
  CHECK(ab.transfer_id == 77);
  CHECK(ab.hashes == a.hashes);
  CHECK(ab.first_block == 2);

  const std::string p = payload(layout().block_bytes(), 3);
  const auto bb = std::get<BlockFrame>(decode_one(encode_block(9, 0xabcdef, 0, 2, p)));
  CHECK(bb.index == 9);
  CHECK(bb.hash == 0xabcdef);
  CHECK(bb.layer_end == 2);
  CHECK(bb.payload == p);

  const auto eb = std::get<End>(decode_one(encode(End{4, 999})));
  CHECK(eb.num_blocks == 4);
  CHECK(eb.payload_bytes == 999);
  const auto xb = std::get<ErrorFrame>(decode_one(encode(ErrorFrame{ErrorCode::lease_expired, "gone"})));
  CHECK(xb.code == ErrorCode::lease_expired);
  CHECK(xb.message == "gone");
}

TEST_CASE("a stream split at every possible byte yields the same frames, whole") {
  std::string stream;
  for (std::uint32_t i = 0; i < 3; ++i) stream += encode_block(i, 100 + i, 0, 2, payload(300, static_cast<char>(i)));
  stream += encode(End{3, 0});
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameDecoder d;
    std::vector<Frame> frames;
    d.feed(std::string_view(stream).substr(0, cut));
    while (auto f = d.next()) frames.push_back(std::move(*f));
    d.feed(std::string_view(stream).substr(cut));
    while (auto f = d.next()) frames.push_back(std::move(*f));
    REQUIRE(frames.size() == 4);
    CHECK(std::get<BlockFrame>(frames[2]).hash == 102);
    CHECK(std::holds_alternative<End>(frames[3]));
    CHECK_FALSE(d.partial());
  }
}

TEST_CASE("one flipped bit anywhere is caught") {
  const std::string good = encode_block(1, 42, 0, 2, payload(64, 1));
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    FrameDecoder d;
    d.feed(bad);
    bool rejected = false;
    try {
      // A flipped length bit may only make the frame look longer: then it waits for bytes (truncated).
      rejected = !d.next().has_value() && d.partial();
    } catch (const WireError&) {
      rejected = true;
    }
    CAPTURE(i);
    CHECK(rejected);
  }
  FrameDecoder d;
  std::string bad = good;
  bad[40] = static_cast<char>(bad[40] ^ 1);  // inside the payload: the checksum says so
  d.feed(bad);
  try {
    d.next();
    FAIL("no error");
  } catch (const WireError& e) {
    CHECK(e.kind == WireError::Kind::checksum);
  }
}

TEST_CASE("truncated, oversized and forged frames") {
  const std::string good = encode(End{1, 2});
  for (std::size_t n = 0; n < good.size(); ++n) {
    FrameDecoder d;
    d.feed(good.substr(0, n));
    CHECK_FALSE(d.next().has_value());
    CHECK(d.partial() == (n > 0));
    CHECK_THROWS_AS(decode_one(good.substr(0, n)), WireError);
  }
  FrameDecoder small(100);
  small.feed(encode_block(0, 1, 0, 2, payload(200, 0)));
  try {
    small.next();
    FAIL("no error");
  } catch (const WireError& e) {
    CHECK(e.kind == WireError::Kind::too_large);
  }
  CHECK_THROWS_AS(decode_one("XXXX" + good.substr(4)), WireError);
  CHECK_THROWS_AS(decode_one(good + "x"), WireError);
  // A well-checksummed frame whose token list claims 2^32-1 entries: rejected before allocating.
  std::string forged = "KVF1";
  forged.push_back(static_cast<char>(FrameType::hello));
  forged.append(3, '\0');
  std::string body;
  body.append("\x01\x00", 2);
  const std::uint32_t huge = 0xffffffffu;
  body.append(reinterpret_cast<const char*>(&huge), 4);
  const auto n = static_cast<std::uint32_t>(body.size());
  forged.append(reinterpret_cast<const char*>(&n), 4);
  forged += body;
  const std::uint64_t sum = XXH3_64bits(forged.data(), forged.size());
  forged.append(reinterpret_cast<const char*>(&sum), 8);
  CHECK_THROWS_AS(decode_one(forged), WireError);
  // An unknown frame type, properly checksummed.
  std::string odd = encode(End{1, 2});
  odd[4] = 9;
  const std::uint64_t s2 = XXH3_64bits(odd.data(), odd.size() - 8);
  std::memcpy(odd.data() + odd.size() - 8, &s2, 8);
  CHECK_THROWS_AS(decode_one(odd), WireError);
}

TEST_CASE("the compatibility hash changes with every field, and mismatches are named") {
  const KvLayout base = layout();
  const std::uint64_t h = compat_hash(base);
  std::vector<KvLayout> variants(9, base);
  variants[0].model_name = "other";
  variants[1].architecture = "llama";
  variants[2].dtype = DType::f16;
  variants[3].kv_dtype = DType::bf16;
  variants[4].num_layers = 3;
  variants[5].num_kv_heads = 4;
  variants[6].head_dim = 32;
  variants[7].block_size = 32;
  variants[8].root = 1;
  for (const auto& v : variants) {
    CHECK(compat_hash(v) != h);
    CHECK_FALSE(describe_mismatch(base, v).empty());
  }
  CHECK(describe_mismatch(base, variants[7]) == "block_size: 16 here, 32 there");
  CHECK(describe_mismatch(base, base).empty());
}

TEST_CASE("peer URLs") {
  std::string host;
  std::uint16_t port = 0;
  CHECK(parse_peer_url("http://127.0.0.1:8001/", host, port));
  CHECK(host == "127.0.0.1");
  CHECK(port == 8001);
  CHECK(parse_peer_url("localhost:9", host, port));
  CHECK_FALSE(parse_peer_url("http://127.0.0.1", host, port));
  CHECK_FALSE(parse_peer_url("http://127.0.0.1:0", host, port));
  CHECK_FALSE(parse_peer_url("http://127.0.0.1:99999", host, port));
  CHECK_FALSE(parse_peer_url("http://h:80/x", host, port));
  CHECK_FALSE(parse_peer_url("", host, port));
}

TEST_CASE("block frames laid out in place are what encode writes, and read back in place") {
  const std::string body = payload(96, 3);
  std::string framed(block_frame_bytes(body.size()) * 2, '\0');
  for (std::uint32_t i = 0; i < 2; ++i) {
    char* f = framed.data() + i * block_frame_bytes(body.size());
    put_block_header(f, 10 + i, 500 + i, 0, 2, body.size());
    std::memcpy(f + kBlockPayloadOffset, body.data(), body.size());
    seal_frame(f, block_frame_bytes(body.size()));
  }
  CHECK(framed.substr(0, block_frame_bytes(body.size())) == encode_block(10, 500, 0, 2, body));
  std::string_view in(framed);
  for (std::uint32_t i = 0; i < 2; ++i) {
    const auto v = peek_frame(in, 1024);
    REQUIRE(v);
    CHECK(v->type == FrameType::block);
    const BlockView b = parse_block(v->payload);
    CHECK(b.index == 10 + i);
    CHECK(b.hash == 500 + i);
    CHECK(b.layer_end == 2);
    CHECK(b.payload == body);
    CHECK(b.payload.data() == in.data() + kBlockPayloadOffset);  // no copy
    in.remove_prefix(v->size);
  }
  CHECK(in.empty());
  CHECK_FALSE(peek_frame(std::string_view(framed).substr(0, 50), 1024));  // not all there yet
  CHECK_THROWS_AS(peek_frame(framed, 64), WireError);                     // over the payload limit
  std::string bad = framed;
  bad[kBlockPayloadOffset + 5] ^= 1;
  try {
    peek_frame(bad, 1024);
    FAIL("no error");
  } catch (const WireError& e) {
    CHECK(e.kind == WireError::Kind::checksum);
  }
  // A block payload whose inner length disagrees with the frame's is malformed.
  std::string forged = encode_block(1, 2, 0, 2, body);
  const std::uint32_t wrong = 95;
  std::memcpy(forged.data() + kBlockPayloadOffset - 4, &wrong, 4);
  seal_frame(forged.data(), forged.size());
  const auto v = peek_frame(forged, 1024);
  REQUIRE(v);
  CHECK_THROWS_AS(parse_block(v->payload), WireError);
}

TEST_CASE("a frame's checksum over pieces (P sends the layers from the cache) is the one seal_frame writes") {
  const std::string body = payload(4 * 64, 7);
  const std::string whole = encode_block(3, 77, 0, 4, body);
  char head[kBlockPayloadOffset];
  put_block_header(head, 3, 77, 0, 4, body.size());
  CHECK(std::string_view(head, sizeof head) == std::string_view(whole).substr(0, kBlockPayloadOffset));
  for (std::size_t split : {std::size_t{1}, std::size_t{64}, std::size_t{100}, body.size()}) {
    std::vector<std::string_view> pieces{std::string_view(head, sizeof head)};
    for (std::size_t at = 0; at < body.size(); at += split) pieces.push_back(std::string_view(body).substr(at, split));
    const std::uint64_t sum = frame_checksum(pieces);
    CHECK(std::memcmp(&sum, whole.data() + whole.size() - kFrameTrailerBytes, sizeof sum) == 0);
  }
}

TEST_CASE("checksums are XXH3-64 whichever implementation computes them (wire.cpp may use the AVX dispatch)") {
  // Large enough for XXH3's long-input loop (the vectorised part) and with odd lengths and splits; this
  // file calls libxxhash's plain XXH3_64bits, so a P and a D built with and without dispatch agree.
  const std::string body = payload(300 * 1024 + 13, 3);
  const std::string whole = encode_block(5, 99, 0, 8, body);
  const std::size_t covered = whole.size() - kFrameTrailerBytes;
  const std::uint64_t plain = XXH3_64bits(whole.data(), covered);
  std::uint64_t written = 0;
  std::memcpy(&written, whole.data() + covered, sizeof written);
  CHECK(written == plain);
  for (std::size_t split : {std::size_t{7}, std::size_t{4096}, std::size_t{65536 + 3}}) {
    std::vector<std::string_view> pieces;
    for (std::size_t at = 0; at < covered; at += split) pieces.push_back(std::string_view(whole).substr(at, std::min(split, covered - at)));
    CHECK(frame_checksum(pieces) == plain);
  }
  CHECK(peek_frame(whole, whole.size()).has_value());
}

namespace {

// A pull's answer from memory, handed out in pieces of `split` bytes (any split must read the same).
class MemorySource : public ByteSource {
 public:
  MemorySource(std::string bytes, std::size_t split) : bytes_(std::move(bytes)), split_(split) {}
  boost::asio::awaitable<std::size_t> read_some_into(std::span<char> into) override {
    const std::size_t n = std::min({into.size(), split_, bytes_.size() - at_});
    std::memcpy(into.data(), bytes_.data() + at_, n);
    at_ += n;
    co_return n;
  }

 private:
  std::string bytes_;
  std::size_t split_, at_ = 0;
};

// read_pull_frames_into over `answer` into `dst`; the exception it ended with (null: none).
std::exception_ptr read_into(std::string answer, std::size_t split, const KvLayout& l, const std::vector<BlockHash>& hashes,
                             std::uint32_t count, std::vector<char*>& dst) {
  boost::asio::io_context io;
  std::exception_ptr failure;
  MemorySource in(std::move(answer), split);
  boost::asio::co_spawn(io, read_pull_frames_into(in, l, hashes, 0, count, std::chrono::steady_clock::now() + std::chrono::minutes(1), dst),
                        [&](std::exception_ptr e) { failure = e; });
  io.run();
  return failure;
}

}  // namespace

TEST_CASE("a pull read straight into landing blocks: every split lands the bytes; corruption, truncation, errors throw") {
  const KvLayout l = layout();
  const std::size_t layers = l.num_layers, layer_bytes = l.block_bytes() / layers;
  std::vector<BlockHash> hashes{11, 22, 33};
  std::string answer;
  std::vector<std::string> payloads;
  for (std::uint32_t i = 0; i < 3; ++i) {
    payloads.push_back(payload(l.block_bytes(), static_cast<char>(i + 1)));
    answer += encode_block(i, hashes[i], 0, static_cast<std::uint16_t>(layers), payloads.back());
  }
  answer += encode(End{3, 3 * block_frame_bytes(l.block_bytes())});
  std::vector<std::string> landing(3 * layers, std::string(layer_bytes, '\0'));  // layers apart, as in a cache
  std::vector<char*> dst;
  for (auto& s : landing) dst.push_back(s.data());
  for (std::size_t split : {std::size_t{1}, std::size_t{7}, std::size_t{4096}, answer.size()}) {
    CAPTURE(split);
    for (auto& s : landing) std::fill(s.begin(), s.end(), '\0');
    REQUIRE_FALSE(read_into(answer, split, l, hashes, 3, dst));
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t k = 0; k < layers; ++k) CHECK(landing[b * layers + k] == payloads[b].substr(k * layer_bytes, layer_bytes));
  }
  const auto reason = [&](std::string bytes, std::vector<BlockHash> want) -> std::string {
    try {
      if (auto e = read_into(std::move(bytes), 4096, l, want, 3, dst)) std::rethrow_exception(e);
    } catch (const PdFailure& f) {
      return f.reason;
    } catch (const WireError& w) {
      return w.kind == WireError::Kind::checksum ? "checksum" : "malformed";
    }
    return "none";
  };
  std::string flipped = answer;
  flipped[kBlockPayloadOffset + 5000] ^= 0x10;  // in block 0's second layer
  CHECK(reason(flipped, hashes) == "checksum");
  CHECK(reason(answer.substr(0, answer.size() - 100), hashes) == "peer_closed");
  CHECK(reason(answer, {11, 99, 33}) == "malformed");  // block 1 carries another hash than D's
  std::string lease = answer.substr(0, block_frame_bytes(l.block_bytes())) + encode(ErrorFrame{ErrorCode::lease_expired, "gone"});
  CHECK(reason(lease, hashes) == "lease_expired");
  CHECK(reason(answer + "x", hashes) == "malformed");  // bytes after the end frame
  std::string bad_magic = answer;
  bad_magic[0] = 'X';
  CHECK(reason(bad_magic, hashes) == "malformed");
}
