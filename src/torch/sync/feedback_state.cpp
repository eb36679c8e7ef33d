#include "torch/sync/feedback_state.h"

#include <algorithm>
#include <cstring>

#include "dsgd/common/log.h"
#include "torch/sync/grad_sync.h"

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

FeedbackState::FeedbackState(const strategy::BucketPlan& plan, const std::vector<torch::Tensor>& params)
    : residuals_(torch::zeros({static_cast<int64_t>(plan.total_elements())}, torch::kFloat32)),
      powersgd_(plan.buckets().size()) {
  for (const auto& b : plan.buckets()) {
    offsets_.push_back(b.offset);
    counts_.push_back(b.count);
    // A slot is dense, so any layout of its parameter reads as this matrix.
    auto& ms = matrices_.emplace_back();
    for (size_t i : b.params) {
      if (params[i].dim() < 2) continue;
      const auto rows = static_cast<size_t>(params[i].size(0));
      ms.push_back({plan.slot(i).offset - b.offset, rows, static_cast<size_t>(params[i].numel()) / rows});
    }
  }
}

std::shared_ptr<comm::Work> FeedbackState::average_async(strategy::ErrorFeedback& strategy, size_t bucket,
                                                         float* data) {
  return strategy.average_with_feedback_async(
      data, counts_[bucket],
      {.index = bucket, .residual = residuals_.data_ptr<float>() + offsets_[bucket], .matrices = &matrices_[bucket],
       .powersgd = &powersgd_[bucket]});
}

// Per GradSync: u64 buckets, u64 count per bucket, u8 residuals present, [floats], then per
// bucket i64 calls, u64 matrices, per matrix u64 floats and the floats.
void FeedbackState::save(std::string* out) const {
  put<uint64_t>(out, counts_.size());
  for (size_t count : counts_) put<uint64_t>(out, count);
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

void FeedbackState::clear() {
  residuals_.zero_();
  for (auto& st : powersgd_) st = {};
}

bool FeedbackState::load(const char** p, const char* end) {
  clear();
  uint64_t n = 0;
  if (!get(p, end, &n) || n != counts_.size()) return false;
  for (size_t expected : counts_) {
    uint64_t count = 0;
    if (!get(p, end, &count) || count != expected) return false;
  }
  uint8_t any = 0;
  if (!get(p, end, &any)) return false;
  if (any != 0 && !get_floats(p, end, residuals_.data_ptr<float>(), static_cast<size_t>(residuals_.numel()))) {
    clear();
    return false;
  }
  for (auto& st : powersgd_) {
    uint64_t matrices = 0;
    if (!get(p, end, &st.calls) || !get(p, end, &matrices) || matrices > (1u << 20)) {
      clear();
      return false;
    }
    st.q.resize(matrices);
    for (auto& q : st.q) {
      uint64_t floats = 0;
      if (!get(p, end, &floats) || floats > static_cast<uint64_t>(end - *p) / sizeof(float)) {
        clear();
        return false;
      }
      q.resize(floats);
      get_floats(p, end, q.data(), q.size());
    }
  }
  return true;
}

namespace {
constexpr char kFeedbackMagic[8] = {'d', 's', 'g', 'd', 'f', 'b', '0', '1'};
}  // namespace

std::string save_feedback(const std::vector<std::unique_ptr<GradSync>>& syncs) {
  std::string out;
  const bool keeps = std::any_of(syncs.begin(), syncs.end(), [](const auto& s) { return s->feedback() != nullptr; });
  if (!keeps) return out;
  out.append(kFeedbackMagic, sizeof kFeedbackMagic);
  const uint64_t count = syncs.size();
  out.append(reinterpret_cast<const char*>(&count), sizeof count);
  for (const auto& s : syncs) {
    if (auto* feedback = s->feedback()) feedback->save(&out);
  }
  return out;
}

void load_feedback(const std::vector<std::unique_ptr<GradSync>>& syncs, const std::string& feedback, bool announce) {
  const bool keeps = std::any_of(syncs.begin(), syncs.end(), [](const auto& s) { return s->feedback() != nullptr; });
  if (!keeps) return;
  const char* p = feedback.data();
  const char* const end = p + feedback.size();
  bool ok = feedback.size() >= sizeof kFeedbackMagic && std::memcmp(p, kFeedbackMagic, sizeof kFeedbackMagic) == 0;
  uint64_t count = 0;
  if (ok) {
    p += sizeof kFeedbackMagic;
    ok = static_cast<size_t>(end - p) >= sizeof count && (std::memcpy(&count, p, sizeof count), count == syncs.size());
    p += ok ? sizeof count : 0;
  }
  for (const auto& s : syncs) {
    auto* state = s->feedback();
    if (!state) continue;
    if (ok) ok = state->load(&p, end);
    if (!ok) state->clear();
  }
  if (!ok && announce) {
    dsgd::log().info(feedback.empty() ? "error feedback starts from zero: the state loaded holds none for this replica "
                                        "(saved without compression, or by a job of another size)"
                                      : "error feedback starts from zero: the state loaded holds it for another layout "
                                        "(bucket sizes or models differ)");
  }
}

}  // namespace dsgd::torch_glue
