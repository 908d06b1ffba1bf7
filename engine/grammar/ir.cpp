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

namespace {

void collect_refs(const Expr& e, std::vector<int>& out) {
  if (e.kind == Expr::Kind::ref) out.push_back(e.rule);
  for (const auto& item : e.items) collect_refs(*item, out);
}

constexpr std::size_t kHuge = std::size_t{1} << 40;

// Thompson nodes `e` expands to, saturating at kHuge; `rule_nodes` gives an inlined rule's size.
std::size_t expansion(const Expr& e, const std::vector<std::size_t>& rule_nodes) {
  switch (e.kind) {
    case Expr::Kind::bytes: return 1;
    case Expr::Kind::ref: return std::min(kHuge, rule_nodes[static_cast<std::size_t>(e.rule)]);
    case Expr::Kind::seq:
    case Expr::Kind::alt: {
      std::size_t n = e.kind == Expr::Kind::alt ? 1 : 0;
      for (const auto& item : e.items) n = std::min(kHuge, n + expansion(*item, rule_nodes) + (e.kind == Expr::Kind::alt));
      return n;
    }
    case Expr::Kind::repeat: {
      const std::size_t item = expansion(*e.items[0], rule_nodes);
      const std::size_t copies = e.max == kUnbounded ? e.min + 1 : e.max;
      return copies > kHuge / std::max<std::size_t>(item + 1, 1) ? kHuge : copies * (item + 1) + 1;
    }
  }
  return kHuge;
}

ExprPtr substitute(const ExprPtr& e, const std::vector<ExprPtr>& inlined) {
  if (e->kind == Expr::Kind::ref) return inlined[static_cast<std::size_t>(e->rule)] ? inlined[static_cast<std::size_t>(e->rule)] : e;
  if (e->items.empty()) return e;
  std::vector<ExprPtr> items;
  bool changed = false;
  for (const auto& item : e->items) {
    items.push_back(substitute(item, inlined));
    changed = changed || items.back() != item;
  }
  if (!changed) return e;
  auto copy = std::make_shared<Expr>(*e);
  copy->items = std::move(items);
  return copy;
}

}  // namespace

void inline_small_rules(Grammar& grammar, std::size_t max_nodes) {
  const std::size_t n = grammar.rules.size();
  std::vector<std::vector<int>> refs(n);
  for (std::size_t r = 0; r < n; ++r) {
    if (grammar.rules[r]) collect_refs(*grammar.rules[r], refs[r]);
  }
  // A rule is recursive when it reaches itself; rules are few, so one search per rule.
  std::vector<char> recursive(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    std::vector<char> seen(n, 0);
    std::vector<int> todo(refs[r].begin(), refs[r].end());
    while (!todo.empty() && !recursive[r]) {
      const int x = todo.back();
      todo.pop_back();
      if (x < 0 || static_cast<std::size_t>(x) >= n || seen[x]) continue;
      seen[x] = 1;
      if (static_cast<std::size_t>(x) == r) recursive[r] = 1;
      todo.insert(todo.end(), refs[x].begin(), refs[x].end());
    }
  }
  // Bottom-up: a rule's inlined form uses its callees' inlined forms, so non-recursive rules are done
  // callees first (they form a DAG); rule_nodes stays huge for rules that are not inlined.
  std::vector<ExprPtr> inlined(n);
  std::vector<std::size_t> rule_nodes(n, kHuge);
  std::vector<char> state(n, 0);  // 0 new, 1 in progress, 2 done
  auto visit = [&](auto&& self, int r) -> void {
    if (state[r]) return;
    state[r] = 1;
    for (const int c : refs[r]) {
      if (c >= 0 && static_cast<std::size_t>(c) < n && !recursive[c] && grammar.rules[c]) self(self, c);
    }
    state[r] = 2;
    if (recursive[r] || !grammar.rules[r] || r == grammar.root) return;
    ExprPtr body = substitute(grammar.rules[r], inlined);
    const std::size_t size = expansion(*body, rule_nodes);
    if (size <= max_nodes) {
      inlined[r] = std::move(body);
      rule_nodes[r] = size;
    }
  };
  for (std::size_t r = 0; r < n; ++r) visit(visit, static_cast<int>(r));
  for (std::size_t r = 0; r < n; ++r) {
    if (grammar.rules[r]) grammar.rules[r] = substitute(grammar.rules[r], inlined);
  }
}

}  // namespace kvfleet::grammar
