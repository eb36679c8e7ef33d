// Progress display for long jobs: a live one-line bar on a terminal, plain periodic lines
// otherwise (CI logs, pipes). Writes to stderr so stdout stays machine-readable.
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "dsgd/runtime/fit.h"

namespace dsgd::cli {

class ProgressPrinter : public dsgd::ProgressListener {
 public:
  // interactive: redraw a bar in place (true on a terminal). line_interval_s: seconds between
  // plain lines when not interactive.
  ProgressPrinter(std::FILE* out, bool interactive, double line_interval_s = 10.0);
  // A language model: each sample is `tokens` tokens. The lines then show tokens/s instead of
  // samples/s, and the epoch's validation loss with its perplexity (exp of the loss per token).
  void count_tokens(int64_t tokens) { tokens_per_sample_ = tokens; }

  void on_batch(const dsgd::BatchProgress& p) override;
  void on_epoch(const dsgd::EpochSummary& s) override;
  // "dsgd train: recovering: <failure>", "dsgd train: resumed 0.21 s after the failure, ...".
  void on_recovery(const dsgd::RecoveryEvent& e) override;
  // A line of its own between bars ("recovering: ...", "resumed ..."), printed at once.
  void on_note(const std::string& line);

 private:
  using Clock = std::chrono::steady_clock;
  std::FILE* out_;
  bool interactive_;
  double line_interval_s_;
  Clock::time_point last_print_{};
  bool printed_ = false;   // the first step always prints (steady_clock may start at boot)
  bool bar_open_ = false;  // a bar is drawn on the current line
  int64_t tokens_per_sample_ = 0;  // 0: not a language model
};

// --profile's figures, one line: "per step, mean over workers: forward 17.3 ms, backward 35.0 ms,
// optimizer 0.4 ms, waiting for communication 5.1 ms, the driver's snapshots 0.2 ms, other 0.8 ms
// (of a 58.6 ms step)".
std::string describe_profile(const std::map<std::string, double>& ms);

// "1:05:09", "4:07" — for ETAs.
std::string format_duration(double seconds);

}  // namespace dsgd::cli
