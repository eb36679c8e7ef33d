// `dsgd settings`: every setting of a job, from its one description (dsgd/runtime/settings.h).
#include <iostream>
#include <string>

#include "commands.h"
#include "dsgd/runtime/settings.h"

namespace dsgd::cli {
namespace {

std::string default_of(const SettingDescription& d) {
  const nlohmann::json v = d.get(TrainerConfig{});
  if (v.is_string()) return v.get<std::string>().empty() ? "\"\"" : v.get<std::string>();
  return v.dump();
}

std::string flag_of(const SettingDescription& d) {
  return d.flag.empty() ? "" : d.flag[0] == '!' ? d.flag.substr(1) : d.flag;
}

// The reference table of docs/SETTINGS.md: a test checks the page holds exactly this.
void print_markdown() {
  std::cout << "| setting | type | default | flag | tune | what it does |\n|---|---|---|---|---|---|\n";
  for (const auto& d : setting_descriptions()) {
    std::string type = d.type;
    if (d.type == "choice") {
      type.clear();
      for (const auto& c : d.choices) type += (type.empty() ? "" : " \\| ") + c;
    }
    std::string help = d.help;
    for (size_t at = help.find('|'); at != std::string::npos; at = help.find('|', at + 2)) help.replace(at, 1, "\\|");
    const std::string flag = flag_of(d);
    std::cout << "| `" << d.path << "` | " << type << " | `" << default_of(d) << "` | "
              << (flag.empty() ? "" : "`" + flag + "`") << " | " << (d.tunable ? "yes" : "") << " | " << help << " |\n";
  }
}

}  // namespace

void add_settings_command(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("settings", "Every setting of a job: its path, type, default, flag and what it does");
  static bool markdown = false;
  cmd->add_flag("--markdown", markdown, "As the Markdown table of docs/SETTINGS.md");
  cmd->callback([exit_code] {
    if (markdown) {
      print_markdown();
    } else {
      for (const auto& d : setting_descriptions()) {
        const std::string flag = flag_of(d);
        std::cout << d.path << " = " << default_of(d) << (flag.empty() ? "" : "  (" + flag + ")")
                  << (d.tunable ? "  [tunable]" : "") << "\n    " << d.help << "\n";
      }
    }
    *exit_code = 0;
  });
}

}  // namespace dsgd::cli
