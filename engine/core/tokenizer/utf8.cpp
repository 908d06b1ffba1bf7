// UTF-8 helpers: validation, lossy decoding (the WHATWG rule that JavaScript's TextDecoder and Hugging
// Face's decoders follow: one U+FFFD per maximal invalid subpart) and GPT-2's byte <-> char mapping.
#include "engine/core/tokenizer/parts.h"

namespace kvfleet::tok {
namespace {

enum class Seq { valid, incomplete, invalid };

// Classifies the sequence at p[0, n): its length when valid, the bytes that belong to it so far
// when it is cut off by the end, or the length of the maximal invalid subpart.
Seq classify(const unsigned char* p, std::size_t n, std::size_t& len) {
  const unsigned char b = p[0];
  len = 1;
  if (b < 0x80) return Seq::valid;
  std::size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return Seq::invalid;
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (k >= n) {
      len = k;
      return Seq::incomplete;
    }
    const unsigned char c = p[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) {
      len = k;
      return Seq::invalid;
    }
  }
  len = need + 1;
  return Seq::valid;
}

}  // namespace

std::size_t utf8_find_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    if (classify(p + i, s.size() - i, len) != Seq::valid) return i;
    i += len;
  }
  return npos;
}

char32_t utf8_decode(std::string_view s, std::size_t i, std::size_t& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const unsigned char b = p[0];
  if (b < 0x80) {
    len = 1;
    return b;
  }
  if (b < 0xE0) {
    len = 2;
    return (char32_t(b & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b < 0xF0) {
    len = 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  len = 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
         (p[3] & 0x3F);
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::size_t utf8_append_lossy(std::string& out, std::string_view bytes, bool keep_tail) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t len;
    const Seq kind = classify(p + i, bytes.size() - i, len);
    if (kind == Seq::valid) {
      out.append(bytes.data() + i, len);
    } else if (kind == Seq::incomplete && keep_tail) {
      return i;
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += len;
  }
  return i;
}

bool is_unicode_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

std::optional<std::uint8_t> unicode_to_byte(char32_t cp) {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    const auto& fwd = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = b;
    return t;
  }();
  if (cp >= table.size() || table[cp] < 0) return std::nullopt;
  return static_cast<std::uint8_t>(table[cp]);
}

}  // namespace kvfleet::tok
