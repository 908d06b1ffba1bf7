// PCRE2 wrapper for the Split pre-tokenizer patterns: UTF + UCP (so \s, \p{L}, \w are Unicode-aware,
// as in the reference implementations) and JIT-compiled. Input is validated UTF-8 before it gets here,
// so matching skips PCRE2's own UTF check.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/core/tokenizer/parts.h"

#include <stdexcept>

namespace kvfleet::tok {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Frees what one find_all call allocated, whichever way it leaves.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~MatchScratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  // Long inputs (a megabyte of spaces against \s+(?!\S)) can outgrow the JIT's default 32 KiB.
  void grow_stack() {
    if (stack) throw std::runtime_error("tokenizer: regex JIT stack exhausted");
    stack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (!stack || !context) throw std::bad_alloc();
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
};

}  // namespace

Regex::Regex(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code) {
    throw std::runtime_error("tokenizer: cannot compile regex /" + pattern + "/ at offset " +
                             std::to_string(offset) + ": " + pcre2_message(error));
  }
  // Without JIT (unsupported platform) pcre2_match still works, only slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, Span range, std::vector<Span>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch scratch;
  scratch.data = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!scratch.data) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data() + range.begin);
  const std::size_t length = range.end - range.begin;
  std::size_t pos = 0;
  while (pos < length) {
    const int rc = pcre2_match(code, subject, length, pos, PCRE2_NO_UTF_CHECK, scratch.data,
                               scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      scratch.grow_stack();
      continue;
    }
    if (rc < 0) throw std::runtime_error("tokenizer: regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    if (ov[1] > ov[0]) {
      out.push_back({range.begin + ov[0], range.begin + ov[1]});
      pos = ov[1];
    } else {
      // An empty match: step over one character (never into the middle of one).
      pos = ov[0] + 1;
      while (pos < length && (subject[pos] & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace kvfleet::tok
