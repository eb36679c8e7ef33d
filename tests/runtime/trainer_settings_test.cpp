// TrainerConfig's fields by name from JSON (apply_settings), the Python module's way in.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "dsgd/error.h"
#include "dsgd/trainer_config.h"

namespace dsgd {
namespace {

using json = nlohmann::json;

TEST(TrainerSettings, NestedAndDottedPathsSetTheFieldsTheyName) {
  TrainerConfig c;
  apply_settings(c, json::parse(R"({"num_workers": 3, "strategy": "ps", "step": {"max_grad_norm": 0.5,
      "precision": "bf16"}, "recovery.standby_workers": 2, "recovery.heartbeat_timeout": 1500,
      "launch": {"hosts": ["a", "b:2"]}, "checkpoints.dir": "/tmp/x", "comm.overlap": false,
      "config": {"lr": 0.1}})"));
  EXPECT_EQ(c.num_workers, 3);
  EXPECT_EQ(c.strategy, Strategy::kPs);
  EXPECT_EQ(c.step.max_grad_norm, 0.5);
  EXPECT_EQ(c.step.precision, Precision::kBf16);
  EXPECT_EQ(c.recovery.standby_workers, 2);
  EXPECT_EQ(c.recovery.heartbeat_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.launch.hosts, (std::vector<std::string>{"a", "b:2"}));
  EXPECT_EQ(c.checkpoints.dir, "/tmp/x");
  EXPECT_FALSE(c.comm.overlap);
  EXPECT_EQ(c.config, json({{"lr", 0.1}}));
  EXPECT_EQ(c.batch_size, TrainerConfig{}.batch_size) << "fields not named keep their defaults";
}

TEST(TrainerSettings, AnUnknownNameOrAWrongTypeIsAConfigErrorNamingTheField) {
  const auto error_of = [](const std::string& text) -> std::pair<std::string, std::string> {
    TrainerConfig c;
    try {
      apply_settings(c, json::parse(text));
    } catch (const ConfigError& e) {
      return {e.what(), e.field()};
    }
    return {"no error", ""};
  };
  EXPECT_EQ(error_of(R"({"step": {"max_grad_norm": "high"}})").first,
            "step.max_grad_norm must be a number, got \"high\"");
  EXPECT_EQ(error_of(R"({"num_workers": 2.5})").second, "num_workers");
  EXPECT_EQ(error_of(R"({"comm.overlap": 1})").first, "comm.overlap must be true or false, got 1");
  EXPECT_EQ(error_of(R"({"recovery": 3})").first, "recovery must be an object of its fields, got 3");
  EXPECT_EQ(error_of(R"({"step.warp": 9})").second, "step.warp");
  EXPECT_NE(error_of(R"({"step.warp": 9})").first.find("unknown setting 'step.warp'"), std::string::npos);
}

// docs/SETTINGS.md lists every field by group; each one can be set by name.
TEST(TrainerSettings, EveryFieldInTheSettingsPageCanBeSetByName) {
  std::ifstream in(DSGD_SOURCE_DIR "/docs/SETTINGS.md");
  ASSERT_TRUE(in) << "docs/SETTINGS.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::set<std::string> names = [] {
    const auto v = setting_names();
    return std::set<std::string>(v.begin(), v.end());
  }();
  const std::regex row(R"(\| (top|`(\w+)`) \| (.*) \|)");
  const std::regex field("`(\\w+)`");
  size_t checked = 0;
  std::string line;
  while (std::getline(text, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    const std::string group = m[2].matched ? m[2].str() + "." : "";
    const std::string fields = m[3];
    for (auto it = std::sregex_iterator(fields.begin(), fields.end(), field); it != std::sregex_iterator(); ++it) {
      const std::string path = group + (*it)[1].str();
      if (path == "config") continue;  // the operator's own (merged key by key)
      EXPECT_TRUE(names.count(path)) << path << " is in docs/SETTINGS.md but apply_settings cannot set it";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40u) << "the page's table was not found";
}

}  // namespace
}  // namespace dsgd
