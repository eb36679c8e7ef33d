// dsgd/error.h — the one exception hierarchy every dsgd API throws from.
//
//   try { dsgd::data::FashionMnist ds(dir, dsgd::data::Split::kTrain); }
//   catch (const dsgd::DataError& e) { std::cerr << e.what(); }   // names the file and the problem
//
// Every message says what was wrong, where, and what to do next. Library code never aborts or
// exits; it throws one of these. In event loops errors are values, thrown at the API boundary.
#pragma once

#include <stdexcept>
#include <string>

namespace dsgd {

// Base of everything dsgd throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration value, CLI flag or API argument is invalid. Thrown before any work starts.
class ConfigError : public Error {
 public:
  using Error::Error;
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

}  // namespace dsgd
