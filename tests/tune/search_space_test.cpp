// The search space: each distribution parsed, drawn within its range and reproducibly; the grid
// crossed; PBT's perturbation staying in range; bad spaces refused naming the key; trial values
// landing in TrainerConfig fields or the operator's config.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "dsgd/common/error.h"
#include "dsgd/runtime/settings.h"
#include "dsgd/tune/tuner.h"

namespace dsgd {
namespace {

using json = nlohmann::json;

const char* kSpace = R"({"lr": {"loguniform": [0.001, 0.1]}, "momentum": {"uniform": [0.5, 0.9]},
                         "batch_size": {"choice": [32, 64, 128]}, "layers": {"randint": [2, 4]},
                         "model": {"grid": ["cnn", "mlp"]}, "lr_decay": 0.7})";

TEST(SearchSpace, DrawsEachDistributionInItsRangeAndTheSameForTheSameSeed) {
  const auto space = SearchSpace::parse(kSpace, "space");
  EXPECT_EQ(space.grid_points(), 2u);
  std::mt19937_64 a(5), b(5);
  std::set<int64_t> batch, layers;
  std::set<std::string> models;
  for (size_t i = 0; i < 200; ++i) {
    const json x = space.sample(i, a);
    EXPECT_EQ(x, space.sample(i, b));
    EXPECT_GE(x["lr"].get<double>(), 0.001);
    EXPECT_LE(x["lr"].get<double>(), 0.1);
    EXPECT_GE(x["momentum"].get<double>(), 0.5);
    EXPECT_LT(x["momentum"].get<double>(), 0.9);
    batch.insert(x["batch_size"].get<int64_t>());
    layers.insert(x["layers"].get<int64_t>());
    models.insert(x["model"].get<std::string>());
    EXPECT_EQ(x["model"], i % 2 == 0 ? "cnn" : "mlp");  // the grid, point by point
    EXPECT_EQ(x["lr_decay"], 0.7);
  }
  EXPECT_EQ(batch, (std::set<int64_t>{32, 64, 128}));
  EXPECT_EQ(layers, (std::set<int64_t>{2, 3, 4}));
  EXPECT_EQ(models.size(), 2u);
  // loguniform: as many draws below the geometric mean (0.01) as above it, roughly.
  std::mt19937_64 g(9);
  int below = 0;
  for (int i = 0; i < 2000; ++i) below += space.sample(0, g)["lr"].get<double>() < 0.01;
  EXPECT_NEAR(below, 1000, 120);
}

TEST(SearchSpace, PerturbationStaysInRangeAndMovesChoicesToANeighbour) {
  const auto space = SearchSpace::parse(kSpace, "space");
  std::mt19937_64 g(3);
  json x = {{"lr", 0.099}, {"momentum", 0.6}, {"batch_size", 64}, {"layers", 3}, {"model", "cnn"}, {"lr_decay", 0.7}};
  for (int i = 0; i < 100; ++i) {
    const json y = space.perturb(x, 0.0, g);
    EXPECT_LE(y["lr"].get<double>(), 0.1);
    EXPECT_TRUE(y["lr"].get<double>() == 0.1 || std::fabs(y["lr"].get<double>() / 0.099 - 0.8) < 1e-9);
    EXPECT_TRUE(y["batch_size"] == 32 || y["batch_size"] == 128) << y["batch_size"];
    EXPECT_EQ(y["lr_decay"], 0.7);
  }
}

TEST(SearchSpace, BadSpacesAreConfigErrorsNamingTheKey) {
  auto says = [](const std::string& text, const std::string& what) {
    try {
      SearchSpace::parse(text, "space.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  says("{}", "space.json is empty");
  says("[1, 2]", "must be a JSON object");
  says("{\"lr\": {\"normal\": [0, 1]}}", "key 'lr': unknown distribution 'normal'");
  says("{\"lr\": {\"uniform\": [1, 0]}}", "key 'lr': 'uniform' needs low < high");
  says("{\"lr\": {\"loguniform\": [0, 1]}}", "needs 0 < low");
  says("{\"b\": {\"choice\": []}}", "key 'b': 'choice' takes a non-empty list");
  says("{\"b\": {\"randint\": [1.5, 3]}}", "whole numbers");
  says("{\"lr\": ", "not valid JSON");
}

TEST(SearchSpace, ValuesSetTrainerFieldsOrTheOperatorsConfig) {
  TrainerConfig base;
  base.config = {{"model", "mlp"}};
  const TrainerConfig c =
      apply_values(base, {{"batch_size", 128}, {"strategy", "ps"}, {"lr", 0.05}, {"num_workers", 2}});
  EXPECT_EQ(c.batch_size, 128);
  EXPECT_EQ(c.strategy, Strategy::kPs);
  EXPECT_EQ(c.num_workers, 2);
  EXPECT_EQ(c.config["lr"], 0.05);
  EXPECT_EQ(c.config["model"], "mlp");
  EXPECT_THROW(apply_values(base, {{"batch_size", 1.5}}), ConfigError);
  EXPECT_THROW(apply_values(base, {{"strategy", 3}}), ConfigError);
}

// The tuner sets exactly the rows marked tunable, by path or by an unambiguous last part.
TEST(SearchSpace, TheTunerSetsTheTunableSettingRowsByTheirPaths) {
  std::vector<std::string> tunable;
  for (const auto& d : setting_descriptions()) {
    if (d.tunable) tunable.push_back(d.path);
  }
  EXPECT_EQ(trainer_fields(), tunable);
  const TrainerConfig c = apply_values(TrainerConfig{}, {{"comm.compression", "bf16"}, {"precision", "bf16"},
                                                         {"step.max_grad_norm", 2.0}, {"lr", 0.3}});
  EXPECT_EQ(c.comm.compression, Compression::kBf16);
  EXPECT_EQ(c.step.precision, Precision::kBf16);
  EXPECT_EQ(c.step.max_grad_norm, 2.0);
  EXPECT_EQ(c.config["lr"], 0.3) << "a key that is no setting is the operator's";
  EXPECT_THROW(SearchSpace::parse(R"({"checkpoints.dir": {"choice": ["a", "b"]}})", "space"), ConfigError)
      << "a setting that is not tunable is refused in a space";
}

}  // namespace
}  // namespace dsgd
