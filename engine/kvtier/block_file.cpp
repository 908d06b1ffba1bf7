#include "engine/kvtier/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <xxhash.h>

namespace kvfleet::kvtier {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'F', 'B', 'L', 'K', '0', '1'};
constexpr const char* kSuffix = ".kvblock";

struct Header {
  char magic[8];
  std::uint64_t compat, hash, parent;
  std::uint32_t block_size, zero32;
  std::uint64_t payload_bytes, checksum, zero64;
};
static_assert(sizeof(Header) == kBlockFileHeaderBytes);

std::uint64_t checksum(BlockHash hash, std::span<const TokenId> tokens, std::span<const std::byte> payload) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, hash);
  XXH3_64bits_update(state, tokens.data(), tokens.size_bytes());
  XXH3_64bits_update(state, payload.data(), payload.size());
  const std::uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Reads up to n bytes; returns how many (fewer at the end of the file), or -1 on an error.
ssize_t read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

std::atomic<std::uint64_t> temp_counter{0};

}  // namespace

std::uint64_t block_compat_hash(std::string_view model_name, std::string_view model_type, const Backend& backend) {
  std::string bytes = "kvfleet KV block v1";
  for (const std::string_view part : {model_name, model_type, backend.name(), dtype_name(backend.kv_dtype())}) {
    bytes.push_back('\0');
    bytes.append(part);
  }
  const KvCacheShape& shape = backend.kv_cache_shape();
  const std::int64_t fields[] = {shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.block_size};
  bytes.append(reinterpret_cast<const char*>(fields), sizeof fields);
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::size_t BlockFileFormat::file_bytes() const {
  return kBlockFileHeaderBytes + static_cast<std::size_t>(block_size) * sizeof(TokenId) + payload_bytes;
}

std::filesystem::path block_folder(const std::filesystem::path& dir, std::uint64_t compat) { return dir / hex(compat); }

std::filesystem::path block_file(const std::filesystem::path& folder, BlockHash hash) { return folder / (hex(hash) + kSuffix); }

std::optional<BlockHash> block_file_hash(const std::string& filename) {
  if (filename.size() != 16 + std::strlen(kSuffix) || !filename.ends_with(kSuffix)) return std::nullopt;
  BlockHash h = 0;
  for (std::size_t i = 0; i < 16; ++i) {
    const char c = filename[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    h = h << 4 | static_cast<BlockHash>(d);
  }
  return h;
}

std::string write_block_file(const std::filesystem::path& folder, const BlockFileFormat& format, const StoredBlock& block) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.compat = format.compat;
  h.hash = block.hash;
  h.parent = block.parent;
  h.block_size = static_cast<std::uint32_t>(block.tokens.size());
  h.payload_bytes = block.bytes.size();
  h.checksum = checksum(block.hash, block.tokens, block.bytes.span());
  const std::filesystem::path final_path = block_file(folder, block.hash);
  char temp_name[96];
  std::snprintf(temp_name, sizeof temp_name, ".%016" PRIx64 ".%d.%" PRIu64 ".tmp", block.hash, static_cast<int>(::getpid()),
                temp_counter.fetch_add(1));
  const std::filesystem::path temp = folder / temp_name;
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return temp.string() + ": " + std::strerror(errno);
  const bool ok = write_all(fd, &h, sizeof h) && write_all(fd, block.tokens.data(), block.tokens.size() * sizeof(TokenId)) &&
                  write_all(fd, block.bytes.data(), block.bytes.size());
  const int saved = errno;
  if (::close(fd) != 0 || !ok) {
    ::unlink(temp.c_str());
    return temp.string() + ": " + std::strerror(ok ? errno : saved);
  }
  if (::rename(temp.c_str(), final_path.c_str()) != 0) {
    const int e = errno;
    ::unlink(temp.c_str());
    return final_path.string() + ": " + std::strerror(e);
  }
  return {};
}

BlockFileRead read_block_file(const std::filesystem::path& folder, const BlockFileFormat& format, BlockHash hash,
                              BlockBuffers* buffers) {
  BlockFileRead out;
  const int fd = ::open(block_file(folder, hash).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) out.error = KvTierError::io;
    return out;
  }
  auto block = std::make_shared<StoredBlock>();
  block->tokens.resize(static_cast<std::size_t>(format.block_size));
  block->bytes = buffers != nullptr && buffers->size() == format.payload_bytes ? buffers->take()
                                                                              : BlockBytes::allocate(format.payload_bytes);
  Header h{};
  const std::size_t token_bytes = block->tokens.size() * sizeof(TokenId);
  const ssize_t nh = read_all(fd, &h, sizeof h);
  const bool header_ok = nh == static_cast<ssize_t>(sizeof h);
  const bool fits = header_ok && std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.compat == format.compat &&
                    h.hash == hash && h.block_size == static_cast<std::uint32_t>(format.block_size) &&
                    h.payload_bytes == format.payload_bytes && h.zero32 == 0 && h.zero64 == 0;
  ssize_t nt = 0, np = 0, extra = 0;
  if (fits) {
    nt = read_all(fd, block->tokens.data(), token_bytes);
    np = nt == static_cast<ssize_t>(token_bytes) ? read_all(fd, block->bytes.data(), block->bytes.size()) : 0;
    char probe = 0;
    if (np == static_cast<ssize_t>(block->bytes.size())) extra = read_all(fd, &probe, 1);
  }
  ::close(fd);
  if (nh < 0 || nt < 0 || np < 0 || extra < 0) {
    out.error = KvTierError::io;
  } else if (!header_ok) {
    out.error = KvTierError::truncated;
  } else if (!fits) {
    out.error = KvTierError::foreign;
  } else if (nt != static_cast<ssize_t>(token_bytes) || np != static_cast<ssize_t>(block->bytes.size())) {
    out.error = KvTierError::truncated;
  } else if (extra != 0 || checksum(hash, block->tokens, block->bytes.span()) != h.checksum) {
    out.error = KvTierError::corrupt;
  } else {
    block->hash = hash;
    block->parent = h.parent;
    out.block = std::move(block);
  }
  return out;
}

}  // namespace kvfleet::kvtier
