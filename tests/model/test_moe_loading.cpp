// MoE configs (Mixtral, Qwen2-MoE, Qwen3-MoE) and checkpoints in both expert layouts.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>

#include "kvfleet/files.h"
#include "kvfleet/make_model.h"
#include "kvfleet/model.h"
#include "support/temp_dir.h"

using namespace kvfleet;

namespace {

template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

MakeModelOptions moe_options(const std::string& arch, bool packed) {
  MakeModelOptions o;
  o.arch = arch;
  o.layers = 2;
  o.hidden = 32;
  o.intermediate = 48;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 64;
  o.experts = 4;
  o.experts_per_tok = 2;
  o.moe_intermediate = 16;
  o.shared_intermediate = 24;
  o.packed_experts = packed;
  return o;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.shape == b.shape && a.dtype == b.dtype && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

}  // namespace

TEST_CASE("MoE config.json: Mixtral, Qwen2-MoE and Qwen3-MoE fields with transformers' defaults") {
  const std::string base = R"("vocab_size":10,"hidden_size":8,"intermediate_size":12,"num_hidden_layers":4,
    "num_attention_heads":2,"num_key_value_heads":1,)";
  const auto m = ModelConfig::parse(R"({"model_type":"mixtral",)" + base + R"("num_local_experts":8,
    "num_experts_per_tok":2,"attention_bias":true})", "mixtral");
  CHECK(m.moe.num_experts == 8);
  CHECK(m.moe.top_k == 2);
  CHECK(m.moe.expert_intermediate == 12);
  CHECK(m.moe.norm_topk_prob);
  CHECK_FALSE(m.qkv_bias);
  for (int i = 0; i < 4; ++i) CHECK(m.moe.is_sparse_layer(i));

  const auto q2 = ModelConfig::parse(R"({"model_type":"qwen2_moe",)" + base + R"("num_experts":6,
    "num_experts_per_tok":3,"moe_intermediate_size":5,"shared_expert_intermediate_size":7,
    "decoder_sparse_step":2,"mlp_only_layers":[3]})", "qwen2_moe");
  CHECK(q2.moe.num_experts == 6);
  CHECK(q2.moe.expert_intermediate == 5);
  CHECK(q2.moe.shared_intermediate == 7);
  CHECK_FALSE(q2.moe.norm_topk_prob);  // Qwen2MoeConfig's default
  CHECK(q2.qkv_bias);
  CHECK_FALSE(q2.o_bias);
  CHECK(std::vector<bool>{q2.moe.is_sparse_layer(0), q2.moe.is_sparse_layer(1), q2.moe.is_sparse_layer(2),
                          q2.moe.is_sparse_layer(3)} == std::vector<bool>{false, true, false, false});

  const auto q3 = ModelConfig::parse(R"({"model_type":"qwen3_moe",)" + base + R"("head_dim":4,
    "norm_topk_prob":true})", "qwen3_moe");
  CHECK(q3.moe.num_experts == 128);  // Qwen3MoeConfig's defaults
  CHECK(q3.moe.top_k == 8);
  CHECK(q3.moe.expert_intermediate == 768);
  CHECK(q3.moe.norm_topk_prob);
  CHECK(q3.qk_norm);
  CHECK_FALSE(q3.qkv_bias);
  CHECK(q3.moe.shared_intermediate == 0);

  const auto dense = ModelConfig::parse(R"({"model_type":"llama",)" + base + R"("num_experts":4})", "llama");
  CHECK_FALSE(dense.moe.enabled());
  CHECK_FALSE(dense.moe.is_sparse_layer(0));

  CHECK(error_of([&] { ModelConfig::parse(R"({"model_type":"mixtral",)" + base + R"("num_local_experts":2,
    "num_experts_per_tok":3})", "c"); }).find("num_experts_per_tok") != std::string::npos);
  CHECK(error_of([&] { ModelConfig::parse(R"({"model_type":"qwen2_moe",)" + base + R"("mlp_only_layers":3})", "c"); })
            .find("mlp_only_layers") != std::string::npos);
}

TEST_CASE("both expert layouts load to the same weights for the same seed") {
  for (const char* arch : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    CAPTURE(arch);
    test::TempDir a, b;
    make_model(moe_options(arch, false), a.path());
    make_model(moe_options(arch, true), b.path());
    const Model per = Model::load(a.path()), packed = Model::load(b.path());
    REQUIRE(per.layers().size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      const auto& x = per.layers()[i].moe;
      const auto& y = packed.layers()[i].moe;
      CHECK_FALSE(x.packed);
      CHECK(y.packed);
      REQUIRE(x.experts.size() == 4);
      REQUIRE(y.experts.size() == 4);
      CHECK(same_bytes(*x.router, *y.router));
      for (std::size_t e = 0; e < 4; ++e) {
        CHECK(same_bytes(x.experts[e].gate, y.experts[e].gate));
        CHECK(same_bytes(x.experts[e].up, y.experts[e].up));
        CHECK(same_bytes(x.experts[e].down, y.experts[e].down));
      }
      CHECK_FALSE(same_bytes(x.experts[0].gate, x.experts[1].gate));
      CHECK((x.shared_gate != nullptr) == (std::string(arch) == "qwen2_moe"));
      CHECK((per.layers()[i].q_norm != nullptr) == (std::string(arch) == "qwen3_moe"));
      CHECK(per.layers()[i].gate == nullptr);  // sparse layers have no dense MLP
    }
  }
}

TEST_CASE("qwen MoE: mlp_only_layers and decoder_sparse_step keep dense MLPs where transformers does") {
  auto o = moe_options("qwen2_moe", false);
  o.layers = 4;
  o.decoder_sparse_step = 2;
  o.mlp_only_layers = {3};
  test::TempDir d;
  make_model(o, d.path());
  const Model m = Model::load(d.path());
  std::vector<bool> sparse;
  for (const auto& l : m.layers()) sparse.push_back(!l.moe.experts.empty());
  CHECK(sparse == std::vector<bool>{false, true, false, false});
  CHECK(m.layers()[0].gate->shape == std::vector<std::int64_t>{48, 32});
}

TEST_CASE("a broken MoE checkpoint names the missing or misshapen tensor") {
  test::TempDir d;
  make_model(moe_options("mixtral", false), d.path());
  // Rewrite the checkpoint without one expert tensor.
  {
    const Checkpoint ck = Checkpoint::open(d.path());
    std::map<std::string, TensorData> t;
    for (const auto& name : ck.names()) {
      if (name == "model.layers.1.block_sparse_moe.experts.3.w2.weight") continue;
      const TensorView& v = ck.get(name);
      const auto* p = static_cast<const std::uint8_t*>(v.data);
      t[name] = {v.dtype, v.shape, std::vector<std::uint8_t>(p, p + v.bytes())};
    }
    std::filesystem::remove(d.path() / "model.safetensors");
    write_safetensors(d.path() / "model.safetensors", t);
  }
  CHECK(error_of([&] { Model::load(d.path()); }).find("model.layers.1.block_sparse_moe.experts.3.w2.weight") !=
        std::string::npos);

  test::TempDir p;
  auto o = moe_options("qwen3_moe", true);
  make_model(o, p.path());
  // config.json says 8 experts, the packed tensors hold 4.
  auto cfg = read_text_file(p.path() / "config.json");
  const auto at = cfg.find("\"num_experts\":4");
  REQUIRE(at != std::string::npos);
  cfg.replace(at, 15, "\"num_experts\":8");
  { std::ofstream(p.path() / "config.json") << cfg; }
  const auto err = error_of([&] { Model::load(p.path()); });
  CHECK(err.find("model.layers.0.mlp.gate.weight") != std::string::npos);
  CHECK(err.find("expected") != std::string::npos);
}

TEST_CASE("kvfleet make-model: Qwen-only MoE flags are refused for mixtral and dense models, not dropped") {
  test::TempDir dir;
  const std::string make = test::bin_dir() + "/kvfleet make-model --vocab 64 --out " + (dir / "m").string();
  const auto mixtral = test::run_command(make + " --arch mixtral --moe-intermediate 16 2>&1");
  CHECK(mixtral.status != 0);
  CHECK(mixtral.out.find("--moe-intermediate: applies to --arch qwen2_moe and qwen3_moe only, not mixtral") != std::string::npos);
  CHECK(mixtral.out.find("Mixtral's experts are --intermediate wide") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "m" / "config.json"));
  const auto dense = test::run_command(make + " --arch llama --decoder-sparse-step 2 2>&1");
  CHECK(dense.status != 0);
  CHECK(dense.out.find("--decoder-sparse-step: applies to --arch qwen2_moe and qwen3_moe only, not llama") != std::string::npos);
  // Mixtral's expert size is --intermediate: it reaches config.json and the expert tensors.
  REQUIRE(test::run_command(make + " --arch mixtral --intermediate 40 --experts 2").status == 0);
  CHECK(ModelConfig::load(dir / "m").moe.expert_intermediate == 40);
  const std::string qwen = test::bin_dir() + "/kvfleet make-model --vocab 64 --out " + (dir / "q").string();
  REQUIRE(test::run_command(qwen + " --arch qwen3_moe --moe-intermediate 24 --experts 2").status == 0);
  CHECK(ModelConfig::load(dir / "q").moe.expert_intermediate == 24);
}
