// TraceFile: the workers' timelines as one Chrome trace.
#include "runtime/worker/trace_file.h"

#include <gtest/gtest.h>

#include <fstream>

#include "dsgd/common/error.h"
#include "testing/temp_dir.h"

namespace dsgd::runtime {
namespace {

using nlohmann::json;

comm::timeline::Recording recording_of(const std::vector<std::string>& threads,
                                       const std::vector<comm::timeline::Event>& events) {
  comm::timeline::Recording r;
  r.threads = threads;
  r.events = events;
  return r;
}

TEST(TraceFile, WorkersBecomeProcessesAndTheirThreadsKeepOneRowAcrossChunks) {
  dsgd::testing::TempDir dir;
  TraceFile file;
  // Worker 0's two chunks number the same threads differently; worker 1 has a thread of the same name.
  file.add(0, "worker 0 (host a, pid 1)",
           trace_json(recording_of({"replica 0", "lane"}, {{"forward", -1, 0, 10, 5}, {"allreduce", 2, 1, 12, 3}})), 0);
  file.add(0, "worker 0 (host a, pid 1)",
           trace_json(recording_of({"lane", "replica 0"}, {{"launch", 4, 0, 1, -1}})), 1000);
  file.add(1, "worker 1 (host b, pid 2)", trace_json(recording_of({"replica 0"}, {{"forward", -1, 0, 11, 4}})), 0);
  EXPECT_EQ(file.num_events(), 4u);
  file.write(dir.file("t.json"));

  const json t = json::parse(std::ifstream(dir.file("t.json")));
  EXPECT_EQ(t.at("displayTimeUnit"), "ms");
  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<int, std::string> process_names;
  std::vector<json> events;
  for (const auto& e : t.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      thread_names[{e.at("pid"), e.at("tid")}] = e["args"]["name"];
    if (e.at("ph") == "M" && e.at("name") == "process_name") process_names[e.at("pid")] = e["args"]["name"];
    if (e.at("ph") != "M") events.push_back(e);
  }
  EXPECT_EQ(process_names,
            (std::map<int, std::string>{{0, "worker 0 (host a, pid 1)"}, {1, "worker 1 (host b, pid 2)"}}));
  EXPECT_EQ(thread_names.size(), 3u);  // worker 0: replica 0, lane; worker 1: replica 0
  ASSERT_EQ(events.size(), 4u);
  auto row = [&](const json& e) { return thread_names.at({e.at("pid"), e.at("tid")}); };
  EXPECT_EQ(events[0].at("name"), "forward");
  EXPECT_EQ(events[0].at("ph"), "X");
  EXPECT_EQ(events[0].at("ts"), 10.0);
  EXPECT_EQ(events[0].at("dur"), 5.0);
  EXPECT_FALSE(events[0].contains("args"));
  EXPECT_EQ(row(events[0]), "replica 0");
  EXPECT_EQ(events[1].at("args").at("bucket"), 2);
  EXPECT_EQ(row(events[1]), "lane");
  // The second chunk: shifted by its offset, on the same row as the first chunk's "lane".
  EXPECT_EQ(events[2].at("name"), "launch");
  EXPECT_EQ(events[2].at("ph"), "i");
  EXPECT_EQ(events[2].at("ts"), 1001.0);
  EXPECT_EQ(events[2].at("tid"), events[1].at("tid"));
  EXPECT_EQ(events[3].at("pid"), 1);
  EXPECT_NE(events[3].at("tid"), events[0].at("tid"));  // another process's thread, another row
}

TEST(TraceFile, ADriversNoteIsAGlobalInstantWithItsArguments) {
  dsgd::testing::TempDir dir;
  TraceFile file;
  file.add_note(2500, "straggler: rank 1", {{"slowdown", 1.42}, {"pid", 7}});
  file.write(dir.file("t.json"));
  std::ifstream in(dir.file("t.json"));
  const json events = json::parse(in).at("traceEvents");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].at("name"), "straggler: rank 1");
  EXPECT_EQ(events[0].at("ph"), "i");
  EXPECT_EQ(events[0].at("s"), "g") << "drawn across every row";
  EXPECT_EQ(events[0].at("ts"), 2500.0);
  EXPECT_EQ(events[0].at("args").at("slowdown"), 1.42);
}

TEST(TraceFile, AMalformedTraceNamesTheWorker) {
  TraceFile file;
  for (const json& bad :
       {json(), json{{"threads", json::array()}}, json{{"threads", {"a"}}, {"events", {{"x", -1, 5, 0, 1}}}},
        json{{"threads", {"a"}}, {"events", {{"x", -1, 0, "soon", 1}}}}}) {
    try {
      file.add(3, "worker 3 (host c, pid 9)", bad, 0);
      FAIL() << "accepted " << bad.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("worker 3 (host c, pid 9)"), std::string::npos) << e.what();
    }
  }
}

TEST(TraceFile, APathInADirectoryThatDoesNotExistIsAConfigError) {
  dsgd::testing::TempDir dir;
  EXPECT_NO_THROW(check_trace_path(dir.file("t.json")));
  EXPECT_THROW(check_trace_path(dir.path().string()), ConfigError);  // a directory
  try {
    check_trace_path("/nonexistent-dsgd-dir/t.json");
    FAIL() << "accepted a directory that does not exist";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dsgd-dir does not exist"), std::string::npos) << e.what();
  }
}

TEST(TraceFile, AnUnwritablePathIsNamed) {
  TraceFile file;
  try {
    file.write("/nonexistent-dsgd-dir/t.json");
    FAIL() << "wrote into a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dsgd-dir/t.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsgd::runtime
