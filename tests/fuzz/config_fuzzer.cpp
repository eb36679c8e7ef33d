// libFuzzer target: any bytes as the `--config` JSON of `dsgd train` / the image classifier.
// It goes through what the CLI does with it: parse_config_text, then image_classifier_options.
// The only acceptable outcomes are valid options or a dsgd::ConfigError; anything else (a crash,
// another exception, a sanitizer report) is a bug. It found two: '{"lr": 1e400}' escaped the
// CLI as nlohmann's out_of_range and aborted `dsgd train`, and '{"synthetic_samples": 10000E020}'
// was an unchecked float-to-integer cast (dsgd/common/json_fields.h). Run with tests/fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dsgd/common/error.h"
#include "dsgd/apps/image_classifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto o = dsgd::image_classifier_options(dsgd::parse_config_text(text, "--config"));
    // Accepted options satisfy the documented ranges.
    if (!(o.lr > 0) || !(o.momentum >= 0 && o.momentum < 1) || !(o.lr_decay > 0 && o.lr_decay <= 1) ||
        o.synthetic_samples < 1 || o.synthetic_image_size < 6 || o.synthetic_image_size > 1024) {
      __builtin_trap();
    }
  } catch (const dsgd::ConfigError&) {
  }
  return 0;
}
