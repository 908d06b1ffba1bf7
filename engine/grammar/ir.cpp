#include "engine/grammar/ir.h"

#include <algorithm>

namespace kvfleet::grammar {

ExprPtr bytes(const ByteSet& set) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::bytes;
  e->bytes = set;
  return e;
}

ExprPtr byte_range(unsigned char lo, unsigned char hi) {
  ByteSet set;
  for (unsigned b = lo; b <= hi; ++b) set.set(b);
  return bytes(set);
}

ExprPtr literal(std::string_view text) {
  std::vector<ExprPtr> items;
  for (const char c : text) {
    ByteSet set;
    set.set(static_cast<unsigned char>(c));
    items.push_back(bytes(set));
  }
  return seq(std::move(items));
}

ExprPtr seq(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::seq;
  e->items = std::move(items);
  return e;
}

ExprPtr alt(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::alt;
  e->items = std::move(items);
  return e;
}

ExprPtr repeat(ExprPtr item, std::size_t min, std::size_t max) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::repeat;
  e->items = {std::move(item)};
  e->min = min;
  e->max = max;
  return e;
}

ExprPtr optional(ExprPtr item) { return repeat(std::move(item), 0, 1); }

ExprPtr ref(int rule) {
  auto e = std::make_shared<Expr>();
  e->kind = Expr::Kind::ref;
  e->rule = rule;
  return e;
}

ExprPtr empty() { return seq({}); }

CodeRanges normalize(CodeRanges ranges) {
  CodeRanges cut;
  for (auto [lo, hi] : ranges) {  // drop the surrogates
    if (lo > hi) std::swap(lo, hi);
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      cut.emplace_back(lo, 0xD7FF);
      lo = 0xE000;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      lo = 0xE000;
    }
    if (lo <= hi) cut.emplace_back(lo, hi);
  }
  std::sort(cut.begin(), cut.end());
  CodeRanges out;
  for (const auto& r : cut) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CodeRanges complement(const CodeRanges& ranges) {
  CodeRanges out;
  char32_t next = 0;
  for (const auto& [lo, hi] : normalize(ranges)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return normalize(out);
}

void append_utf8(std::string& out, char32_t cp) {
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

namespace {

std::size_t utf8_length(char32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// Splits [lo, hi] until both ends have the same length and each continuation position spans whole
// 6-bit blocks, so the range is one sequence of byte ranges (the utf8-ranges algorithm of RE2 and Rust).
void split_range(char32_t lo, char32_t hi, std::vector<ExprPtr>& out) {
  for (const char32_t edge : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
    if (lo <= edge && hi > edge) {
      split_range(lo, edge, out);
      split_range(edge + 1, hi, out);
      return;
    }
  }
  const std::size_t n = utf8_length(lo);
  for (std::size_t i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_range(lo, lo | m, out);
        split_range((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_range(lo, (hi & ~m) - 1, out);
        split_range(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  std::vector<ExprPtr> items;
  for (std::size_t i = 0; i < a.size(); ++i) {
    items.push_back(byte_range(static_cast<unsigned char>(a[i]), static_cast<unsigned char>(b[i])));
  }
  out.push_back(seq(std::move(items)));
}

}  // namespace

ExprPtr utf8_ranges(const CodeRanges& ranges) {
  std::vector<ExprPtr> out;
  ByteSet ascii;
  for (const auto& [lo, hi] : normalize(ranges)) {
    if (hi < 0x80) {
      for (char32_t c = lo; c <= hi; ++c) ascii.set(c);
      continue;
    }
    if (lo < 0x80) {
      for (char32_t c = lo; c < 0x80; ++c) ascii.set(c);
    }
    split_range(std::max<char32_t>(lo, 0x80), hi, out);
  }
  if (ascii.any()) out.insert(out.begin(), bytes(ascii));
  if (out.empty()) return bytes(ByteSet{});  // matches nothing
  return alt(std::move(out));
}

}  // namespace kvfleet::grammar
