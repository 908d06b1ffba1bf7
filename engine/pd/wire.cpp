#include "engine/pd/wire.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (frame_checksum)
#include <xxhash.h>
#if KVFLEET_XXH3_DISPATCH
// XXH3_64bits and XXH3_64bits_update become libxxhash's runtime-dispatched versions (AVX2 / AVX-512 where
// the CPU has them; the plain ones are the SSE2 baseline): the same values, about 3x faster on bytes in
// cache (11 -> 30 GB/s here), and every byte of a KV transfer is checksummed on P and again on D.
#include <xxh_x86dispatch.h>
#endif

#include <cstring>

namespace kvfleet::pd {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'F', '1'};

class Writer {
 public:
  template <typename T>
  void num(T v) {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);  // little-endian host (block_hash.h asserts it)
  }
  void str(std::string_view s) {
    num(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void list(const std::vector<T>& v) {
    num(static_cast<std::uint32_t>(v.size()));
    for (const T& x : v) num(x);
  }
  void layout(const KvLayout& l) {
    str(l.model_name);
    str(l.architecture);
    num(l.dtype);
    num(l.kv_dtype);
    for (std::int64_t v : {l.num_layers, l.num_kv_heads, l.head_dim, l.block_size}) num(v);
    num(l.root);
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T num() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string_view view() {
    const auto n = num<std::uint32_t>();
    need(n);
    const std::string_view s = in_.substr(at_, n);
    at_ += n;
    return s;
  }
  std::string str() { return std::string(view()); }
  template <typename T>
  std::vector<T> list() {
    const auto n = num<std::uint32_t>();
    need(std::size_t{n} * sizeof(T));  // before reserving: a forged count cannot make us allocate
    std::vector<T> v;
    v.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) v.push_back(num<T>());
    return v;
  }
  DType dtype() {
    const auto d = num<std::uint8_t>();
    if (d > static_cast<std::uint8_t>(DType::bf16)) throw WireError(WireError::Kind::malformed, "unknown dtype");
    return static_cast<DType>(d);
  }
  KvLayout layout() {
    KvLayout l;
    l.model_name = str();
    l.architecture = str();
    l.dtype = dtype();
    l.kv_dtype = dtype();
    l.num_layers = num<std::int64_t>();
    l.num_kv_heads = num<std::int64_t>();
    l.head_dim = num<std::int64_t>();
    l.block_size = num<std::int64_t>();
    l.root = num<BlockHash>();
    return l;
  }
  bool at_end() const { return at_ == in_.size(); }
  void done() const {
    if (at_ != in_.size()) throw WireError(WireError::Kind::malformed, "trailing bytes in a frame payload");
  }

 private:
  void need(std::size_t n) const {
    if (in_.size() - at_ < n) throw WireError(WireError::Kind::malformed, "frame payload too short");
  }
  std::string_view in_;
  std::size_t at_ = 0;
};

std::string frame(FrameType type, std::string_view payload) {
  std::string out(kMagic, 4);
  out.push_back(static_cast<char>(type));
  out.append(3, '\0');
  const auto n = static_cast<std::uint32_t>(payload.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(payload);
  const std::uint64_t sum = XXH3_64bits(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  return out;
}

std::string payload_of(const Hello& h) {
  Writer w;
  w.num(h.version);
  w.layout(h.layout);
  w.num(h.compat_hash);
  w.num(static_cast<std::uint32_t>(h.transports.size()));
  for (const auto& t : h.transports) w.str(t);
  w.list(h.tokens);
  w.list(h.held);
  w.num(h.lease_ms);
  if (!h.cache_salt.empty()) w.str(h.cache_salt);  // optional trailer: unsalted hellos stay byte-identical
  return std::move(w.bytes());
}

std::string payload_of(const Accept& a) {
  Writer w;
  w.layout(a.layout);
  w.num(a.compat_hash);
  w.str(a.transport);
  w.num(a.transfer_id);
  w.num(a.lease_ms);
  w.num(a.first_block);
  w.num(a.num_blocks);
  w.list(a.hashes);
  if (a.transport_port != 0) {  // optional trailer (ucx): old accepts stay byte-identical
    w.str(a.transport_host);
    w.num(a.transport_port);
  }
  return std::move(w.bytes());
}

Frame parse(FrameType type, std::string_view payload) {
  Reader r(payload);
  Frame out;
  switch (type) {
    case FrameType::hello: {
      Hello h;
      h.version = r.num<std::uint16_t>();
      h.layout = r.layout();
      h.compat_hash = r.num<std::uint64_t>();
      const auto n = r.num<std::uint32_t>();
      if (n > 16) throw WireError(WireError::Kind::malformed, "too many transports");
      h.transports.clear();
      for (std::uint32_t i = 0; i < n; ++i) h.transports.push_back(r.str());
      h.tokens = r.list<TokenId>();
      h.held = r.list<BlockHash>();
      h.lease_ms = r.num<std::uint32_t>();
      if (!r.at_end()) h.cache_salt = r.str();
      out = std::move(h);
      break;
    }
    case FrameType::accept: {
      Accept a;
      a.layout = r.layout();
      a.compat_hash = r.num<std::uint64_t>();
      a.transport = r.str();
      a.transfer_id = r.num<std::uint64_t>();
      a.lease_ms = r.num<std::uint32_t>();
      a.first_block = r.num<std::uint32_t>();
      a.num_blocks = r.num<std::uint32_t>();
      a.hashes = r.list<BlockHash>();
      if (!r.at_end()) {
        a.transport_host = r.str();
        a.transport_port = r.num<std::uint16_t>();
      }
      out = std::move(a);
      break;
    }
    case FrameType::block: {
      const BlockView v = parse_block(payload);
      return BlockFrame{v.index, v.hash, v.layer_begin, v.layer_end, std::string(v.payload)};
    }
    case FrameType::end: {
      End e;
      e.num_blocks = r.num<std::uint32_t>();
      e.payload_bytes = r.num<std::uint64_t>();
      out = e;
      break;
    }
    case FrameType::error: {
      ErrorFrame e;
      e.code = static_cast<ErrorCode>(r.num<std::uint16_t>());
      e.message = r.str();
      out = std::move(e);
      break;
    }
    default:
      throw WireError(WireError::Kind::malformed, "unknown frame type " + std::to_string(static_cast<int>(type)));
  }
  r.done();
  return out;
}

}  // namespace

std::string encode(const Frame& f) {
  struct Visit {
    std::string operator()(const Hello& h) const { return frame(FrameType::hello, payload_of(h)); }
    std::string operator()(const Accept& a) const { return frame(FrameType::accept, payload_of(a)); }
    std::string operator()(const BlockFrame& b) const {
      return encode_block(b.index, b.hash, b.layer_begin, b.layer_end, b.payload);
    }
    std::string operator()(const End& e) const {
      Writer w;
      w.num(e.num_blocks);
      w.num(e.payload_bytes);
      return frame(FrameType::end, w.bytes());
    }
    std::string operator()(const ErrorFrame& e) const {
      Writer w;
      w.num(e.code);
      w.str(e.message);
      return frame(FrameType::error, w.bytes());
    }
  };
  return std::visit(Visit{}, f);
}

void put_block_header(char* frame, std::uint32_t index, BlockHash hash, std::uint16_t layer_begin,
                      std::uint16_t layer_end, std::size_t payload_bytes) {
  const auto n = static_cast<std::uint32_t>(kBlockFieldsBytes + payload_bytes);
  const auto size = static_cast<std::uint32_t>(payload_bytes);
  char* at = frame;
  const auto put = [&at](const void* v, std::size_t k) {
    std::memcpy(at, v, k);
    at += k;
  };
  put(kMagic, 4);
  const char type_and_pad[4] = {static_cast<char>(FrameType::block), 0, 0, 0};
  put(type_and_pad, 4);
  put(&n, sizeof n);
  put(&index, sizeof index);
  put(&hash, sizeof hash);
  put(&layer_begin, sizeof layer_begin);
  put(&layer_end, sizeof layer_end);
  put(&size, sizeof size);
}

void seal_frame(char* frame, std::size_t total) {
  const std::uint64_t sum = XXH3_64bits(frame, total - kFrameTrailerBytes);
  std::memcpy(frame + total - kFrameTrailerBytes, &sum, sizeof sum);
}

std::uint64_t frame_checksum(std::span<const std::string_view> pieces) {
  XXH3_state_t state;  // (on the stack: XXH3_createState would allocate per frame)
  XXH3_64bits_reset(&state);
  for (const std::string_view p : pieces) XXH3_64bits_update(&state, p.data(), p.size());
  return XXH3_64bits_digest(&state);
}

std::string encode_block(std::uint32_t index, BlockHash hash, std::uint16_t layer_begin, std::uint16_t layer_end,
                         std::string_view payload) {
  std::string out(block_frame_bytes(payload.size()), '\0');
  put_block_header(out.data(), index, hash, layer_begin, layer_end, payload.size());
  std::memcpy(out.data() + kBlockPayloadOffset, payload.data(), payload.size());
  seal_frame(out.data(), out.size());
  return out;
}

std::optional<FrameView> peek_frame(std::string_view in, std::size_t max_payload) {
  if (in.size() < kFrameHeaderBytes) return std::nullopt;
  if (std::memcmp(in.data(), kMagic, 4) != 0) throw WireError(WireError::Kind::malformed, "bad frame magic");
  std::uint32_t n = 0;
  std::memcpy(&n, in.data() + 8, sizeof n);
  if (n > max_payload) throw WireError(WireError::Kind::too_large, "frame payload of " + std::to_string(n) + " bytes");
  const std::size_t total = kFrameHeaderBytes + n + kFrameTrailerBytes;
  if (in.size() < total) return std::nullopt;
  std::uint64_t sum = 0;
  std::memcpy(&sum, in.data() + kFrameHeaderBytes + n, sizeof sum);
  if (XXH3_64bits(in.data(), kFrameHeaderBytes + n) != sum) throw WireError(WireError::Kind::checksum, "frame checksum mismatch");
  return FrameView{static_cast<FrameType>(in[4]), in.substr(kFrameHeaderBytes, n), total};
}

BlockView parse_block(std::string_view payload) {
  Reader r(payload);
  BlockView b;
  b.index = r.num<std::uint32_t>();
  b.hash = r.num<BlockHash>();
  b.layer_begin = r.num<std::uint16_t>();
  b.layer_end = r.num<std::uint16_t>();
  b.payload = r.view();
  r.done();
  return b;
}

Frame parse_frame(const FrameView& view) { return parse(view.type, view.payload); }

std::optional<Frame> FrameDecoder::next() {
  const auto view = peek_frame(std::string_view(buffer_).substr(offset_), max_payload_);
  if (!view) return std::nullopt;
  Frame f = parse(view->type, view->payload);
  offset_ += view->size;
  if (offset_ > (1u << 20) && offset_ * 2 > buffer_.size()) {  // drop consumed bytes now and then
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  return f;
}

Frame decode_one(std::string_view bytes) {
  FrameDecoder d(bytes.size());
  d.feed(bytes);
  auto f = d.next();
  if (!f) throw WireError(WireError::Kind::malformed, "truncated frame");
  if (d.partial()) throw WireError(WireError::Kind::malformed, "bytes after the frame");
  return std::move(*f);
}

}  // namespace kvfleet::pd
