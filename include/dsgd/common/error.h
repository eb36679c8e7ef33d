// dsgd/common/error.h — the one exception hierarchy every dsgd API throws from.
//
//   try { dsgd::data::FashionMnist ds(dir, dsgd::data::Split::kTrain); }
//   catch (const dsgd::DataError& e) { std::cerr << e.what(); }   // names the file and the problem
//
// Every message says what was wrong, where, and what to do next. Library code never aborts or
// exits; it throws one of these. In event loops errors are values, thrown at the API boundary.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace dsgd {

// Base of everything dsgd throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration value, CLI flag or API argument is invalid. Thrown before any work starts.
// field() names the TrainerConfig field at fault ("num_workers", "compression"), where one is,
// so a front end can name its own spelling of it (the CLI's --workers); "" otherwise.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message, std::string field = "")
      : Error(message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// A data file is missing or malformed. path() names the file; what() says the problem.
class DataError : public Error {
 public:
  DataError(std::string path, const std::string& problem)
      : Error(path + ": " + problem), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A communication operation failed: a peer died, a connection broke, the group was aborted.
// op() names the operation ("allreduce #17"), peer() the rank at fault (-1 if unknown) and
// host() its host ("" if unknown). A group that raised it must be re-formed, not reused.
class CommError : public Error {
 public:
  CommError(const std::string& message, std::string op = "", int peer = -1, std::string host = "")
      : Error(message), op_(std::move(op)), peer_(peer), host_(std::move(host)) {}
  const std::string& op() const { return op_; }
  int peer() const { return peer_; }
  const std::string& host() const { return host_; }

 private:
  std::string op_;
  int peer_;
  std::string host_;
};

// A wait ran past its deadline: a peer hung, or a key never appeared. A CommError, since the
// group that raised it is as unusable as after any other communication failure.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A rule the settings' validation enforces (dsgd::validate_config), asserted where the code relies
// on it: a break is a bug of dsgd's, never a user's mistake, and says which rule it relied on.
//   require_checked(ring_ == 0 || !strategy_->error_feedback(), "ZeRO without compression (validate_zero)");
inline void require_checked(bool holds, const char* rule) {
  if (!holds) throw Error(std::string("dsgd bug: a rule validate_config checks does not hold here: ") + rule);
}

}  // namespace dsgd
