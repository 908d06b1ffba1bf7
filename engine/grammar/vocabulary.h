// A vocabulary for the grammar engine: the bytes each token id stands for, the stop ids, and a token
// trie in preorder (a node's subtree is the range [node, subtree_end)) for mask walks that skip a whole
// subtree when its prefix is refused.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvfleet/block_hash.h"

namespace kvfleet {
class Tokenizer;
}

namespace kvfleet::grammar {

// The UTF-8 decoder as a DFA over bytes: 0 between characters, 1..7 inside one (what may follow
// differs), kUtf8Invalid after a byte no valid UTF-8 (no surrogates, no overlong forms) has there.
constexpr std::uint8_t kUtf8Invalid = 8;
std::uint8_t utf8_next(std::uint8_t state, std::uint8_t byte);
// Plain text: printable ASCII except '"' and '\\', and every byte of a multi-byte character: the bytes
// a JSON string (and most text rules) take without leaving their loop.
inline bool plain_byte(std::uint8_t b) { return b >= 0x80 || (b >= 0x20 && b < 0x7F && b != '"' && b != '\\'); }

class Vocabulary {
 public:
  struct Node {
    std::uint8_t byte;
    std::uint16_t depth;       // 1 for a token's first byte
    std::int32_t subtree_end;  // one past the last node of this node's subtree
    std::int32_t tokens_begin, tokens_end;  // into tokens_at_nodes(): ids whose bytes end here
    std::int32_t subtree = -1;              // into subtrees() for a subtree of kBulkNodes nodes or more
    // Every node (a small subtree too): the longest path below the parent in bytes, the UTF-8 decoder's
    // state before the node's byte, and whether every path is valid plain text from there.
    std::uint16_t height = 0;
    std::uint8_t utf8_before = 0;
    bool plain = false;
  };
  // What a mask walk needs to accept a large subtree without visiting it.
  struct Subtree {
    std::bitset<256> bytes;       // every byte on its nodes, the node's own included
    std::uint16_t height = 0;     // the longest path below the parent, in bytes
    std::uint8_t utf8_before = 0;  // the UTF-8 decoder's state (utf8_next) before the node's byte
    bool plain = false;           // every path is valid UTF-8 (from utf8_before) of plain text bytes
  };
  static constexpr std::int32_t kBulkNodes = 64;

  // token_bytes[id] empty: the id is never allowed except as a stop id.
  Vocabulary(std::vector<std::string> token_bytes, std::vector<TokenId> stop_ids);
  // Every non-special id with its decoder bytes; stop_ids default to the tokenizer's eos ids.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tokenizer,
                                                          std::vector<TokenId> stop_ids = {});

  std::size_t size() const { return bytes_.size(); }
  const std::string& bytes(TokenId id) const { return bytes_[static_cast<std::size_t>(id)]; }
  const std::vector<TokenId>& stop_ids() const { return stop_ids_; }
  bool is_stop(TokenId id) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<TokenId>& tokens_at_nodes() const { return node_tokens_; }
  std::size_t max_token_bytes() const { return max_token_bytes_; }  // the trie's depth
  const std::vector<Subtree>& subtrees() const { return subtrees_; }
  std::uint64_t fingerprint() const { return fingerprint_; }  // identifies the vocabulary in cache keys

 private:
  std::vector<std::string> bytes_;
  std::vector<TokenId> stop_ids_;
  std::vector<Node> nodes_;
  std::vector<TokenId> node_tokens_;
  std::uint64_t fingerprint_ = 0;
  std::size_t max_token_bytes_ = 0;
  std::vector<Subtree> subtrees_;
};

}  // namespace kvfleet::grammar
