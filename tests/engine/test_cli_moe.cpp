// The MoE tools from outside: make-model --arch mixtral|qwen2_moe|qwen3_moe, inspect, and
// logits --ep-size N printing exactly what one rank prints.
#include <doctest/doctest.h>

#include "support/temp_dir.h"

using namespace kvfleet;

TEST_CASE("kvfleet make-model/inspect/logits on MoE models, logits --ep-size 1, 2, 4 identical") {
  test::TempDir dir;
  const std::string bin = test::bin_dir() + "/kvfleet ";
  const std::string model = (dir / "moe").string();
  auto made = test::run_command(bin + "make-model --arch qwen2_moe --experts 8 --experts-per-tok 2 --packed-experts "
                                "--mlp-only-layers 0 --vocab 128 --out " + model);
  REQUIRE(made.status == 0);
  const auto inspect = test::run_command(bin + "inspect --model " + model);
  REQUIRE(inspect.status == 0);
  CHECK(inspect.out.find("experts:      8, top-2") != std::string::npos);
  CHECK(inspect.out.find("packed (experts.gate_up_proj) layout") != std::string::npos);
  CHECK(inspect.out.find("sparse:       1 of 2 layers") != std::string::npos);
  CHECK(inspect.out.find("shared:") != std::string::npos);

  const std::string logits = bin + "logits --backend cpu --model " + model + " --ids 5,9,2,77,31,8,64,1,3";
  const auto one = test::run_command(logits);
  REQUIRE(one.status == 0);
  CHECK(one.out.find("\"logits\"") != std::string::npos);
  for (const char* n : {"2", "4"}) {
    CAPTURE(n);
    const auto ep = test::run_command(logits + " --ep-size " + n);
    REQUIRE(ep.status == 0);
    CHECK(ep.out == one.out);
  }
  const auto bad = test::run_command(logits + " --ep-size 3 2>&1");
  CHECK(bad.status != 0);
  CHECK(bad.out.find("do not split over ep_size 3") != std::string::npos);

  for (const char* arch : {"mixtral", "qwen3_moe"}) {
    CAPTURE(arch);
    const std::string m = (dir / arch).string();
    REQUIRE(test::run_command(bin + "make-model --arch " + arch + " --vocab 64 --out " + m).status == 0);
    const auto i = test::run_command(bin + "inspect --model " + m);
    CHECK(i.status == 0);
    CHECK(i.out.find("per-expert (experts.N.*) layout") != std::string::npos);
  }
}
