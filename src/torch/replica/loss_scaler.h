// Dynamic loss scaling, with the semantics of PyTorch's GradScaler (torch.cuda.amp): the loss is
// multiplied by a scale S before backward so that small float16 gradients do not flush to zero,
// the gradients by 1/S before the optimizer step; a step whose gradients are not finite (S too
// large: they overflowed) is skipped and S halved; after `growth_interval` finite steps in a row
// S doubles.
//
//   LossScaler scaler({.init_scale = 65536});
//   (loss * scaler.scale()).backward();  grads *= 1 / scaler.scale();
//   if (scaler.update(all_finite)) optimizer.step();
//
// S stays a power of two (init_scale must be one), so scaling and unscaling are exact: with
// float32 gradients that neither overflow nor leave the normal range, a scaled step is the
// unscaled step bit for bit. Every replica must feed update() the same answer (the runtime's
// gradient check gives every replica the same one), so S is the same everywhere. Torch-free.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "dsgd/common/error.h"

namespace dsgd::torch_glue {

class LossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, GradScaler's
    int64_t growth_interval = 2000;
  };
  // The scale stays within [kMinScale, kMaxScale].
  static constexpr double kMinScale = 0x1p-24;
  static constexpr double kMaxScale = 0x1p64;

  explicit LossScaler(Options o) : scale_(o.init_scale), growth_interval_(o.growth_interval) {
    if (!is_power_of_two(o.init_scale) || o.init_scale < kMinScale || o.init_scale > kMaxScale) {
      throw ConfigError("loss_scale must be a power of two in [2^-24, 2^64] (scaling is then exact), got " +
                        std::to_string(o.init_scale));
    }
    if (o.growth_interval < 1) {
      throw ConfigError("loss_scale_growth_interval must be >= 1, got " + std::to_string(o.growth_interval));
    }
  }

  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }

  // After a step's gradient check: true (take the step) when `finite`, counting it towards the
  // next growth; false (skip it) otherwise, S halved and the count reset.
  bool update(bool finite) {
    if (!finite) {
      scale_ = std::max(kMinScale, scale_ * 0.5);
      good_steps_ = 0;
      return false;
    }
    if (++good_steps_ >= growth_interval_) {
      scale_ = std::min(kMaxScale, scale_ * 2.0);
      good_steps_ = 0;
    }
    return true;
  }
  // Whether S cannot back off further: a non-finite gradient at this scale is not an overflow.
  bool at_minimum() const { return scale_ <= kMinScale; }

  // For snapshots and checkpoints.
  void restore(double scale, int64_t good_steps) {
    if (is_power_of_two(scale) && scale >= kMinScale && scale <= kMaxScale && good_steps >= 0) {
      scale_ = scale;
      good_steps_ = good_steps;
    }
  }

  static bool is_power_of_two(double x) {
    if (!(x > 0) || !std::isfinite(x)) return false;
    int e = 0;
    return std::frexp(x, &e) == 0.5;
  }

 private:
  double scale_;
  int64_t good_steps_ = 0;
  int64_t growth_interval_;
};

}  // namespace dsgd::torch_glue
