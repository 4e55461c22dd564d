// DeepSpeed-Chat's pairwise reward loss (lib/chat/reward_loss.h) against
// its RewardModel.forward run by torch (test/chat/reward_ref.py): the loss,
// the end scores and the gradient of every reward (autograd), on pairs that
// diverge early or late, end at different pads, have no pad at all, are
// identical, or start with a pad (OPT's bos: num_padding_at_beginning 1).
// Skips when /usr/bin/python3 cannot import torch.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "lib/chat/reward_loss.h"
#include "lib/core/error.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;
using nlohmann::json;
using Catch::Matchers::Contains;

namespace {

struct Case {
  std::vector<int32_t> c, r;  // (bs, T)
  std::vector<float> cr, rr;
  int64_t bs = 0, T = 0;
  int32_t pad = 0;
  int npb = 0;
  chat::RewardPairs pairs() const {
    return {.chosen_ids = c.data(), .rejected_ids = r.data(), .chosen_rewards = cr.data(),
            .rejected_rewards = rr.data(), .bs = bs, .T = T, .pad_id = pad, .num_padding_at_beginning = npb};
  }
};

// A pair: a common prefix of `common` tokens (the first `lead` of them pads),
// then `cl` / `rl` more tokens of each, then pads to T.
void add_pair(Case& k, std::mt19937& g, int common, int lead, int cl, int rl) {
  std::uniform_int_distribution<int> tok(3, 50);
  std::vector<int32_t> c(static_cast<size_t>(k.T), k.pad), r(static_cast<size_t>(k.T), k.pad);
  for (int t = 0; t < common; ++t) c[t] = r[t] = t < lead ? k.pad : tok(g);
  for (int t = common; t < common + cl && t < k.T; ++t) c[t] = tok(g);
  for (int t = common; t < common + rl && t < k.T; ++t) r[t] = tok(g);
  k.c.insert(k.c.end(), c.begin(), c.end());
  k.r.insert(k.r.end(), r.begin(), r.end());
  ++k.bs;
}

json to_json(const Case& k) {
  auto rows = [&](const auto& v) {
    json a = json::array();
    for (int64_t i = 0; i < k.bs; ++i)
      a.push_back(std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + i * k.T,
                                                                               v.begin() + (i + 1) * k.T));
    return a;
  };
  return {{"chosen_ids", rows(k.c)}, {"rejected_ids", rows(k.r)}, {"chosen_rewards", rows(k.cr)},
          {"rejected_rewards", rows(k.rr)}, {"pad_id", k.pad}, {"npb", k.npb}};
}

}  // namespace

TEST_CASE("the pairwise reward loss, scores and gradients are DeepSpeed-Chat's") {
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<Case> cases;
  for (int npb : {0, 1}) {
    Case k;
    k.T = 16;
    k.pad = 2;
    k.npb = npb;
    const int lead = npb;  // OPT: the bos is the pad id
    add_pair(k, g, 5, lead, 4, 7);    // chosen ends first
    add_pair(k, g, 3, lead, 9, 2);    // rejected ends first
    add_pair(k, g, 6, lead, 20, 20);  // neither reaches a pad: both end at T
    add_pair(k, g, 16, lead, 0, 0);   // identical
    add_pair(k, g, 7, lead, 0, 3);    // chosen is the prefix: diverges where the chosen pads start
    for (int64_t i = 0; i < k.bs * k.T; ++i) {
      k.cr.push_back(nd(g));
      k.rr.push_back(nd(g));
    }
    cases.push_back(k);
  }
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "ds_reward_cases.json";
  json all = json::array();
  for (const Case& k : cases) all.push_back(to_json(k));
  std::ofstream(file) << all.dump();
  const char* src = std::getenv("DS_SOURCE_DIR");
  std::vector<std::string> lines;
  const int rc = test::popen_lines("/usr/bin/python3 " + std::string(src ? src : ".") + "/test/chat/reward_ref.py " +
                                       file.string() + " 2>&1",
                                   lines);
  std::filesystem::remove(file);
  if (rc == 77) DS_SKIP((lines.empty() ? std::string("torch not importable") : lines[0]));
  REQUIRE(rc == 0);
  REQUIRE(lines.size() == cases.size());
  for (size_t n = 0; n < cases.size(); ++n) {
    const json ref = json::parse(lines[n]);
    const chat::RewardLoss got = chat::reward_pair_loss(cases[n].pairs());
    INFO("case " << n);
    REQUIRE(!ref["loss"].is_null());
    CHECK(got.loss == Approx(ref["loss"].get<double>()).epsilon(1e-6));
    for (int64_t i = 0; i < cases[n].bs; ++i) {
      CHECK(got.chosen_scores[i] == Approx(ref["chosen_scores"][i].get<double>()).epsilon(1e-6));
      CHECK(got.rejected_scores[i] == Approx(ref["rejected_scores"][i].get<double>()).epsilon(1e-6));
      for (int64_t t = 0; t < cases[n].T; ++t) {
        CHECK(got.dchosen[i * cases[n].T + t] ==
              Approx(ref["dchosen"][i][t].get<double>()).epsilon(1e-5).margin(1e-9));
        CHECK(got.drejected[i * cases[n].T + t] ==
              Approx(ref["drejected"][i][t].get<double>()).epsilon(1e-5).margin(1e-9));
      }
    }
  }
}

TEST_CASE("a pair that differs at its first token is refused, as DeepSpeed-Chat's assertion") {
  const std::vector<int32_t> c = {5, 6, 2, 2}, r = {7, 6, 2, 2};
  const std::vector<float> v = {0.f, 0.f, 0.f, 0.f};
  const chat::RewardPairs p{.chosen_ids = c.data(), .rejected_ids = r.data(), .chosen_rewards = v.data(),
                            .rejected_rewards = v.data(), .bs = 1, .T = 4, .pad_id = 2,
                            .num_padding_at_beginning = 0};
  CHECK_THROWS_WITH(chat::reward_pair_loss(p), Contains("differs at its first token"));
}
