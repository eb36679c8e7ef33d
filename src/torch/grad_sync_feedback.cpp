// GradSync's error feedback as bytes (save_feedback, load_feedback): what snapshots and
// checkpoints hold of a compressing strategy's residuals and PowerSGD states, per replica.
#include <algorithm>
#include <cstring>

#include "torch/grad_sync.h"

namespace dsgd::torch_glue {

namespace {

template <typename T>
void put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_floats(std::string* out, const float* f, size_t n) {
  out->append(reinterpret_cast<const char*>(f), n * sizeof(float));
}
template <typename T>
bool get(const char** p, const char* end, T* v) {
  if (end - *p < static_cast<std::ptrdiff_t>(sizeof(T))) return false;
  std::memcpy(v, *p, sizeof(T));
  *p += sizeof(T);
  return true;
}
bool get_floats(const char** p, const char* end, float* f, size_t n) {
  if (static_cast<size_t>(end - *p) / sizeof(float) < n) return false;
  std::memcpy(f, *p, n * sizeof(float));
  *p += n * sizeof(float);
  return true;
}

}  // namespace

// Per GradSync: u64 buckets, u64 count per bucket, u8 residuals present, [floats], then per
// bucket i64 calls, u64 matrices, per matrix u64 floats and the floats.
void GradSync::save_feedback(std::string* out) const {
  if (!residuals_.defined()) return;
  const auto& buckets = plan_.buckets();
  put<uint64_t>(out, buckets.size());
  for (const auto& b : buckets) put<uint64_t>(out, b.count);
  const float* r = residuals_.data_ptr<float>();
  const size_t n = static_cast<size_t>(residuals_.numel());
  const bool any = std::any_of(r, r + n, [](float x) { return x != 0.0f; });
  put<uint8_t>(out, any ? 1 : 0);
  if (any) put_floats(out, r, n);
  for (const auto& st : powersgd_) {
    put<int64_t>(out, st.calls);
    put<uint64_t>(out, st.q.size());
    for (const auto& q : st.q) {
      put<uint64_t>(out, q.size());
      put_floats(out, q.data(), q.size());
    }
  }
}

void GradSync::clear_feedback() {
  if (!residuals_.defined()) return;
  residuals_.zero_();
  for (auto& st : powersgd_) st = {};
}

bool GradSync::load_feedback(const char** p, const char* end) {
  if (!residuals_.defined()) return true;
  clear_feedback();
  const auto& buckets = plan_.buckets();
  uint64_t n = 0;
  if (!get(p, end, &n) || n != buckets.size()) return false;
  for (const auto& b : buckets) {
    uint64_t count = 0;
    if (!get(p, end, &count) || count != b.count) return false;
  }
  uint8_t any = 0;
  if (!get(p, end, &any)) return false;
  if (any != 0 && !get_floats(p, end, residuals_.data_ptr<float>(), static_cast<size_t>(residuals_.numel()))) {
    clear_feedback();
    return false;
  }
  for (auto& st : powersgd_) {
    uint64_t matrices = 0;
    if (!get(p, end, &st.calls) || !get(p, end, &matrices) || matrices > (1u << 20)) {
      clear_feedback();
      return false;
    }
    st.q.resize(matrices);
    for (auto& q : st.q) {
      uint64_t floats = 0;
      if (!get(p, end, &floats) || floats > static_cast<uint64_t>(end - *p) / sizeof(float)) {
        clear_feedback();
        return false;
      }
      q.resize(floats);
      get_floats(p, end, q.data(), q.size());
    }
  }
  return true;
}

}  // namespace dsgd::torch_glue
