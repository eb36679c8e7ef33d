#include "runtime/worker/trace_file.h"

#include <filesystem>
#include <fstream>

#include "dsgd/common/error.h"

namespace dsgd::runtime {

using nlohmann::json;

json trace_json(const comm::timeline::Recording& recording) {
  json events = json::array();
  for (const auto& e : recording.events) {
    events.push_back(json::array({e.name, e.bucket, e.thread, e.start_us, e.duration_us}));
  }
  return {{"threads", recording.threads}, {"events", std::move(events)}, {"dropped", recording.dropped}};
}

void check_trace_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw ConfigError("trace_path " + path + ": directory " + dir.string() + " does not exist; create it first");
  }
  if (fs::is_directory(p, ec)) throw ConfigError("trace_path " + path + ": is a directory; name a file");
}

void TraceFile::add(int worker, const std::string& worker_name, const json& trace, double offset_us) {
  auto bad = [&](const std::string& what) {
    return Error("trace from " + worker_name + ": " + what +
                 " (driver and worker built from different dsgd versions?)");
  };
  if (!trace.is_object() || !trace.contains("threads") || !trace.contains("events") || !trace["threads"].is_array() ||
      !trace["events"].is_array()) {
    throw bad("not an object with \"threads\" and \"events\" arrays");
  }
  if (!named_[worker]) {
    named_[worker] = true;
    metadata_.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", worker}, {"args", {{"name", worker_name}}}});
    metadata_.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", worker}, {"args", {{"sort_index", worker}}}});
  }
  std::vector<int> tids;
  for (const auto& name : trace["threads"]) {
    if (!name.is_string()) throw bad("a thread name that is not a string");
    auto [it, added] =
        threads_.emplace(std::make_pair(worker, name.get<std::string>()), static_cast<int>(threads_.size()));
    if (added) {
      metadata_.push_back({{"name", "thread_name"},
                           {"ph", "M"},
                           {"pid", worker},
                           {"tid", it->second},
                           {"args", {{"name", it->first.second}}}});
      // Replicas' rows first, then the communication threads, each in order of appearance.
      const int sort = (it->first.second.rfind("replica", 0) == 0 ? 0 : 1000) + it->second;
      metadata_.push_back({{"name", "thread_sort_index"},
                           {"ph", "M"},
                           {"pid", worker},
                           {"tid", it->second},
                           {"args", {{"sort_index", sort}}}});
    }
    tids.push_back(it->second);
  }
  for (const auto& e : trace["events"]) {
    if (!e.is_array() || e.size() != 5 || !e[0].is_string() || !e[1].is_number_integer() ||
        !e[2].is_number_unsigned() || !e[3].is_number() || !e[4].is_number()) {
      throw bad("an event that is not [name, bucket, thread, start_us, duration_us]");
    }
    const auto thread = e[2].get<size_t>();
    if (thread >= tids.size())
      throw bad("an event on thread " + std::to_string(thread) + " of " + std::to_string(tids.size()));
    json out = {{"name", e[0]},
                {"cat", "dsgd"},
                {"pid", worker},
                {"tid", tids[thread]},
                {"ts", offset_us + e[3].get<double>()}};
    const double duration_us = e[4].get<double>();
    if (duration_us < 0) {
      out["ph"] = "i";
      out["s"] = "t";
    } else {
      out["ph"] = "X";
      out["dur"] = duration_us;
    }
    if (e[1].get<int64_t>() >= 0) out["args"] = {{"bucket", e[1]}};
    events_.push_back(std::move(out));
  }
  dropped_ += trace.value("dropped", uint64_t{0});
}

void TraceFile::add_note(double at_us, const std::string& name, const json& args) {
  events_.push_back({{"name", name}, {"ph", "i"}, {"s", "g"}, {"ts", at_us}, {"pid", 0}, {"tid", 0}, {"args", args}});
}

void TraceFile::write(const std::string& path) const {
  json all = metadata_;
  for (const auto& e : events_) all.push_back(e);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write the trace to " + path + ": check that its directory exists and is writable");
  out << json{{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}}.dump();
  out.close();
  if (!out) throw Error("writing the trace to " + path + " failed (disk full?)");
}

}  // namespace dsgd::runtime
