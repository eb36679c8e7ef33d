#include "progress.h"

#include <cmath>
#include <string>

namespace dsgd::cli {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool interactive, double line_interval_s)
    : out_(out), interactive_(interactive), line_interval_s_(line_interval_s) {}

void ProgressPrinter::on_batch(const dsgd::BatchProgress& p) {
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_print_).count();
  const bool last = p.step == p.total_steps;
  if (printed_ && !last && since < (interactive_ ? 0.1 : line_interval_s_)) return;
  printed_ = true;
  last_print_ = now;
  const double eta = p.samples_per_s > 0 ? p.elapsed_s / p.step * (p.total_steps - p.step) : NAN;
  const bool tokens = tokens_per_sample_ > 0;
  const double rate = tokens ? p.samples_per_s * static_cast<double>(tokens_per_sample_) : p.samples_per_s;
  const char* unit = tokens ? "tokens/s" : "samples/s";
  std::string slow;  // "  straggler: rank 1 (host a, pid 7) 1.42x"
  for (const auto& s : p.stragglers) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s rank %d (host %s, pid %lld) %.2fx", slow.empty() ? "  straggler:" : ",",
                  s.rank, s.host.c_str(), static_cast<long long>(s.pid), s.slowdown);
    slow += buf;
  }
  if (interactive_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * p.batch / std::max<int64_t>(1, p.batches_per_epoch));
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld  loss %.4f  %.0f %s  ETA %s%s",
                 static_cast<long long>(p.epoch), static_cast<long long>(p.epochs), bar.c_str(),
                 static_cast<long long>(p.batch), static_cast<long long>(p.batches_per_epoch), p.loss, rate, unit,
                 format_duration(eta).c_str(), slow.c_str());
    bar_open_ = true;
  } else {
    std::fprintf(out_, "epoch %lld/%lld batch %lld/%lld  loss %.4f  %.0f %s  ETA %s%s\n",
                 static_cast<long long>(p.epoch), static_cast<long long>(p.epochs), static_cast<long long>(p.batch),
                 static_cast<long long>(p.batches_per_epoch), p.loss, rate, unit, format_duration(eta).c_str(),
                 slow.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::on_epoch(const dsgd::EpochSummary& s) {
  if (bar_open_) std::fputs("\r\033[K", out_);
  bar_open_ = false;
  if (tokens_per_sample_ > 0) {
    std::fprintf(out_, "epoch %lld done in %.1f s: train loss %.4f, %.0f tokens/s", static_cast<long long>(s.epoch),
                 s.epoch_s, s.train_loss, s.samples_per_s * static_cast<double>(tokens_per_sample_));
    if (s.test_loss >= 0) std::fprintf(out_, ", val loss %.4f, perplexity %.2f", s.test_loss, std::exp(s.test_loss));
  } else {
    std::fprintf(out_, "epoch %lld done in %.1f s: train loss %.4f, %.0f samples/s", static_cast<long long>(s.epoch),
                 s.epoch_s, s.train_loss, s.samples_per_s);
  }
  if (s.test_accuracy >= 0 && tokens_per_sample_ == 0)
    std::fprintf(out_, ", test loss %.4f, test accuracy %.2f%%", s.test_loss, 100 * s.test_accuracy);
  std::fputc('\n', out_);
  if (!s.profile_ms.empty()) std::fprintf(out_, "  %s\n", describe_profile(s.profile_ms).c_str());
  std::fflush(out_);
}

void ProgressPrinter::on_recovery(const dsgd::RecoveryEvent& e) {
  char buf[256];
  if (e.kind == "scale_up") {
    std::snprintf(buf, sizeof(buf), "dsgd train: back to %d worker(s) in %.2f s", e.workers_after, e.recovery_s);
    on_note(buf);
  } else if (e.resumed_at == std::chrono::steady_clock::time_point{}) {
    on_note("dsgd train: recovering: " + e.failure);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "dsgd train: resumed %.2f s after the failure, with %d worker(s)%s; %lld step(s) to redo%s",
                  e.recovery_s, e.workers_after, e.standbys_used > 0 ? " (a standby took over)" : "",
                  static_cast<long long>(e.rolled_back_steps), e.from_peer ? " (a survivor's state)" : "");
    on_note(buf);
  }
}

void ProgressPrinter::on_note(const std::string& line) {
  if (bar_open_) std::fputs("\r\033[K", out_);
  bar_open_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

std::string describe_profile(const std::map<std::string, double>& ms) {
  static constexpr std::pair<const char*, const char*> kLabels[] = {{"forward", "forward"},
                                                                    {"backward", "backward"},
                                                                    {"optimizer", "optimizer"},
                                                                    {"comm_wait", "waiting for communication"},
                                                                    {"snapshot", "the driver's snapshots"},
                                                                    {"other", "other"}};
  std::string out = "per step, mean over workers:";
  char buf[96];
  const char* sep = " ";
  for (const auto& [key, label] : kLabels) {
    const auto it = ms.find(key);
    if (it == ms.end()) continue;
    std::snprintf(buf, sizeof(buf), "%s%s %.1f ms", sep, label, it->second);
    out += buf;
    sep = ", ";
  }
  const auto step = ms.find("step");
  if (step != ms.end()) {
    std::snprintf(buf, sizeof(buf), " (of a %.1f ms step)", step->second);
    out += buf;
  }
  return out;
}

}  // namespace dsgd::cli
