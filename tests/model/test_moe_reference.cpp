// MoE logits against the independent numpy reference (tests/reference/moe_ref.py), on tiny random
// Mixtral, Qwen2-MoE and Qwen3-MoE models in both expert layouts, f32 and bf16.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cmath>
#include <cstring>

#include "kvfleet/make_model.h"
#include "runner_helpers.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

std::vector<double> moe_reference(const std::filesystem::path& dir, const std::vector<TokenId>& ids) {
  std::string list;
  for (auto id : ids) {
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  const std::string cmd = "/usr/bin/python3 " + std::string(KVFLEET_SOURCE_DIR) + "/tests/reference/moe_ref.py --model " +
                          dir.string() + " --ids " + list;
  const auto r = test::run_command(cmd);
  REQUIRE_MESSAGE(r.status == 0, "the numpy reference failed (run scripts/setup for python3-numpy): " << cmd);
  std::vector<double> out;
  const auto doc = boost::json::parse(r.out);
  for (const auto& row : doc.at("logits").as_array().at(0).as_array())
    for (const auto& v : row.as_array()) out.push_back(v.to_number<double>());
  return out;
}

MakeModelOptions base(const std::string& arch) {
  MakeModelOptions o;
  o.arch = arch;
  o.layers = 2;
  o.hidden = 64;
  o.intermediate = 96;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 300;
  o.seed = 7;
  o.experts = 8;
  o.experts_per_tok = 2;
  o.moe_intermediate = 48;
  o.shared_intermediate = 80;
  return o;
}

std::vector<TokenId> prompt(std::size_t n) {
  std::vector<TokenId> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<TokenId>((i * 37 + 11) % 300);
  return ids;
}

// max |ours - ref| / max |ref|.
double relative_error(const std::vector<float>& ours, const std::vector<double>& ref) {
  REQUIRE(ours.size() == ref.size());
  double max_diff = 0.0, max_ref = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(ours[i] - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  REQUIRE(max_ref > 0.5);
  return max_diff / max_ref;
}

}  // namespace

TEST_CASE("MoE logits match the numpy reference: every architecture, both layouts, f32 and bf16") {
  struct Variant {
    std::string name;
    MakeModelOptions o;
  };
  std::vector<Variant> variants;
  for (const char* arch : {"mixtral", "qwen2_moe", "qwen3_moe"})
    for (bool packed : {false, true})
      for (DType dt : {DType::f32, DType::bf16}) {
        auto o = base(arch);
        o.packed_experts = packed;
        o.dtype = dt;
        variants.push_back({std::string(arch) + (packed ? " packed " : " per-expert ") + std::string(dtype_name(dt)), o});
      }
  {
    auto o = base("qwen2_moe");
    o.layers = 4;
    o.decoder_sparse_step = 2;
    o.mlp_only_layers = {3};
    o.norm_topk_prob = false;
    o.experts_per_tok = 3;
    variants.push_back({"qwen2_moe sparse step 2, mlp_only_layers [3], no renormalisation, top-3", o});
  }
  {
    auto o = base("mixtral");
    o.experts_per_tok = 1;
    o.tie_embeddings = true;
    variants.push_back({"mixtral top-1, tied", o});
  }
  const auto ids = prompt(40);
  for (const auto& v : variants) {
    CAPTURE(v.name);
    test::TempDir dir;
    make_model(v.o, dir.path());
    const Model model = Model::load(dir.path());
    CHECK(relative_error(test::all_logits(model, ids), moe_reference(dir.path(), ids)) < 1e-4);
  }
}

TEST_CASE("the two expert layouts give bit-identical logits") {
  for (const char* arch : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    CAPTURE(arch);
    auto o = base(arch);
    o.dtype = DType::bf16;
    test::TempDir a, b;
    make_model(o, a.path());
    o.packed_experts = true;
    make_model(o, b.path());
    const Model per = Model::load(a.path()), packed = Model::load(b.path());
    const auto ids = prompt(24);
    const auto x = test::all_logits(per, ids), y = test::all_logits(packed, ids);
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  }
}
