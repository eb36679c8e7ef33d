// Every setting's one description (dsgd/runtime/settings.h): set by name from JSON (apply_settings, the
// Python module's way in), printed back (settings_of), and each row's rule.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dsgd/common/error.h"
#include "dsgd/runtime/settings.h"

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

// Each row is whole: a path of its own, a type, help, a flag of its own where it has one, and a
// default its own rule keeps.
TEST(TrainerSettings, EveryRowHasItsOwnPathFlagHelpAndADefaultItsRuleKeeps) {
  std::set<std::string> paths, flags;
  const TrainerConfig defaults;
  for (const auto& d : setting_descriptions()) {
    EXPECT_TRUE(paths.insert(d.path).second) << d.path << " twice";
    if (!d.flag.empty()) EXPECT_TRUE(flags.insert(d.flag).second) << d.flag << " twice";
    EXPECT_FALSE(d.help.empty()) << d.path;
    EXPECT_FALSE(d.type.empty()) << d.path;
    EXPECT_EQ(d.type == "choice", !d.choices.empty()) << d.path;
    EXPECT_EQ(d.rule(defaults), "") << d.path << ": the default breaks its own rule";
    EXPECT_EQ(find_setting(d.path), &d);
  }
  EXPECT_GT(paths.size(), 55u);
  EXPECT_EQ(setting_groups(),
            (std::vector<std::string>{"step", "comm", "ps", "launch", "recovery", "checkpoints", "monitor"}));
}

// What settings_of prints, apply_settings takes back: every row, with a value unlike its default.
TEST(TrainerSettings, SettingsOfReadsBackIntoTheSameConfig) {
  TrainerConfig c;
  c.num_workers = 3;
  c.strategy = "ps_async";
  c.seed = 77;
  c.step.precision = "bf16";
  c.step.max_grad_norm = 0.25;
  c.comm.compression = "powersgd";
  c.comm.powersgd_rank = 7;
  c.comm.forward_overlap_buckets = -1;
  c.comm.timeout = std::chrono::milliseconds(1234);
  c.ps.placement = "processes";
  c.launch.hosts = {"a", "b:2"};
  c.recovery.from_peer = false;
  c.recovery.on_straggler = "evict";
  c.checkpoints.max_overhead = 0.125;
  c.monitor.metrics_dir = "m";
  const json printed = settings_of(c);
  EXPECT_EQ(printed["comm.compression"], "powersgd:7");
  EXPECT_EQ(printed["comm.forward_overlap_buckets"], "auto");
  EXPECT_EQ(printed["comm.timeout"], 1234);
  EXPECT_FALSE(printed.contains("launch.token")) << "a secret, not printed";
  TrainerConfig back;
  apply_settings(back, printed);
  EXPECT_EQ(settings_of(back), printed);
  EXPECT_EQ(back.comm.powersgd_rank, 7);
  EXPECT_EQ(changed_settings(TrainerConfig{}), json::object());
  EXPECT_EQ(changed_settings(c).size(), 15u) << changed_settings(c).dump();
}

TEST(TrainerSettings, DurationsTakeMillisecondsOrAUnit) {
  TrainerConfig c;
  apply_settings(
      c, {{"recovery.heartbeat_timeout", "30s"}, {"comm.timeout", "2m"}, {"launch.registration_timeout", "250ms"}});
  EXPECT_EQ(c.recovery.heartbeat_timeout, std::chrono::milliseconds(30000));
  EXPECT_EQ(c.comm.timeout, std::chrono::milliseconds(120000));
  EXPECT_EQ(c.launch.registration_timeout, std::chrono::milliseconds(250));
  apply_settings(c, {{"recovery.driver_grace", "1h"}});
  EXPECT_EQ(c.recovery.driver_grace, std::chrono::milliseconds(3600000));
  EXPECT_THROW(apply_settings(c, {{"comm.timeout", "soon"}}), ConfigError);
  EXPECT_THROW(apply_settings(c, {{"comm.timeout", "3 days"}}), ConfigError);
}

// A field's own range is its row's rule, and validate_config applies it naming the field.
TEST(TrainerSettings, ARowsRuleNamesItsFieldAndTheValue) {
  const auto broken = [](const std::function<void(TrainerConfig&)>& change) -> std::pair<std::string, std::string> {
    TrainerConfig c;
    change(c);
    try {
      check_setting_rules(c);
    } catch (const ConfigError& e) {
      return {e.field(), e.what()};
    }
    return {"", "kept"};
  };
  EXPECT_EQ(broken([](TrainerConfig& c) { c.num_workers = 0; }),
            std::make_pair(std::string("num_workers"), std::string("num_workers must be in 1..4096, got 0")));
  EXPECT_EQ(broken([](TrainerConfig& c) { c.step.zero_stage = 5; }).first, "step.zero_stage");
  EXPECT_EQ(broken([](TrainerConfig& c) { c.strategy = "gossip"; }).second,
            "unknown strategy 'gossip'; use simple, allreduce, ps or ps_async");
  EXPECT_EQ(broken([](TrainerConfig& c) { c.recovery.heartbeat_timeout = std::chrono::milliseconds(50); }).second,
            "recovery.heartbeat_timeout must be >= 100 ms, got 50");
  EXPECT_EQ(broken([](TrainerConfig& c) { c.launch.listen = "nohost"; }).first, "launch.listen");
  EXPECT_EQ(broken([](TrainerConfig& c) { c.step.max_grad_norm = -1; }).first, "step.max_grad_norm");
  EXPECT_EQ(broken([](TrainerConfig& c) { c.step.max_grad_norm = 1; }).second, "kept");
}

}  // namespace
}  // namespace dsgd
