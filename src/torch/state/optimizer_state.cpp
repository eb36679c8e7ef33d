// Optimizer state by its named values (torch/state/optimizer_state.h).
#include "torch/state/optimizer_state.h"

#include <torch/optim.h>
#include <torch/serialize.h>
#include <torch/types.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

namespace dsgd::torch_glue {

namespace ser = torch::serialize;

std::string bytes_of(ser::OutputArchive& archive) {
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  return bytes;
}

StateFields state_fields(ser::InputArchive& archive) {
  StateFields fields;
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    archive.read(key, value);
    fields.emplace_back(key, std::move(value));
  }
  return fields;
}

namespace {

void add(StateFields* fields, const char* name, const torch::Tensor& t) {
  if (t.defined()) fields->emplace_back(name, t);  // as serialize() leaves out an undefined one
}

template <typename State>  // Adam's and AdamW's, alike
void adam_fields(const State& x, StateFields* out) {
  out->emplace_back("step", c10::IValue(x.step()));
  add(out, "exp_avg", x.exp_avg());
  add(out, "exp_avg_sq", x.exp_avg_sq());
  add(out, "max_exp_avg_sq", x.max_exp_avg_sq());
}

// The states of LibTorch's own elementwise optimizers, field by field as their serialize() names
// them, without its copy of every tensor into an archive and back (at gpt-base's 1 GB of AdamW
// state, 2.8 s of a checkpoint's 4.5). The tensors are the state's own.
bool known_fields(const torch::optim::OptimizerParamState& s, StateFields* out) {
  namespace o = torch::optim;
  if (const auto* x = dynamic_cast<const o::AdamParamState*>(&s)) {
    adam_fields(*x, out);
  } else if (const auto* x = dynamic_cast<const o::AdamWParamState*>(&s)) {
    adam_fields(*x, out);
  } else if (const auto* x = dynamic_cast<const o::SGDParamState*>(&s)) {
    add(out, "momentum_buffer", x->momentum_buffer());
  } else if (const auto* x = dynamic_cast<const o::RMSpropParamState*>(&s)) {
    out->emplace_back("step", c10::IValue(x->step()));
    add(out, "square_avg", x->square_avg());
    add(out, "momentum_buffer", x->momentum_buffer());
    add(out, "grad_avg", x->grad_avg());
  } else if (const auto* x = dynamic_cast<const o::AdagradParamState*>(&s)) {
    add(out, "sum", x->sum());
    out->emplace_back("step", c10::IValue(x->step()));
  } else {
    return false;
  }
  return true;
}

}  // namespace

StateFields state_fields(const torch::optim::OptimizerParamState& state) {
  StateFields fields;
  if (known_fields(state, &fields)) return fields;
  ser::OutputArchive out;
  state.serialize(out);
  const std::string bytes = bytes_of(out);
  ser::InputArchive in;
  in.load_from(bytes.data(), bytes.size());
  return state_fields(in);
}

void write_fields(ser::OutputArchive& archive, const StateFields& fields) {
  for (const auto& [name, value] : fields) archive.write(name, value);
}

std::string archive_key(const torch::Tensor& p) {
  std::ostringstream out;
  out << p.unsafeGetTensorImpl();
  return out.str();
}

bool per_element(const c10::IValue& v, const torch::Tensor& p) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().sizes() == p.sizes();
}

namespace {

const c10::IValue* field(const StateFields& fields, const char* name) {
  for (const auto& [n, v] : fields) {
    if (n == name) return &v;
  }
  return nullptr;
}
torch::Tensor tensor_field(const StateFields& fields, const char* name) {
  const auto* v = field(fields, name);
  return v != nullptr && v->isTensor() ? v->toTensor() : torch::Tensor();
}
int64_t int_field(const StateFields& fields, const char* name) {
  const auto* v = field(fields, name);
  return v != nullptr && v->isInt() ? v->toInt() : 0;
}

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(const StateFields& f) {
  auto s = std::make_unique<State>();
  s->step(int_field(f, "step"));
  s->exp_avg(tensor_field(f, "exp_avg"));
  s->exp_avg_sq(tensor_field(f, "exp_avg_sq"));
  s->max_exp_avg_sq(tensor_field(f, "max_exp_avg_sq"));
  return s;
}

// A state of the optimizer's own kind from its fields (LibTorch's elementwise optimizers, fields
// of the names known_fields gives); null for another kind or another set of fields.
std::unique_ptr<torch::optim::OptimizerParamState> known_state(torch::optim::Optimizer& opt, const StateFields& f) {
  namespace o = torch::optim;
  const auto has = [&](std::initializer_list<const char*> allowed) {
    for (const auto& [n, v] : f) {
      if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return n == a; })) return false;
    }
    return true;
  };
  if (dynamic_cast<o::Adam*>(&opt) != nullptr && has({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})) {
    return adam_state<o::AdamParamState>(f);
  }
  if (dynamic_cast<o::AdamW*>(&opt) != nullptr && has({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"})) {
    return adam_state<o::AdamWParamState>(f);
  }
  if (dynamic_cast<o::SGD*>(&opt) != nullptr && has({"momentum_buffer"})) {
    auto s = std::make_unique<o::SGDParamState>();
    s->momentum_buffer(tensor_field(f, "momentum_buffer"));
    return s;
  }
  if (dynamic_cast<o::RMSprop*>(&opt) != nullptr && has({"step", "square_avg", "momentum_buffer", "grad_avg"})) {
    auto s = std::make_unique<o::RMSpropParamState>();
    s->step(int_field(f, "step"));
    s->square_avg(tensor_field(f, "square_avg"));
    s->momentum_buffer(tensor_field(f, "momentum_buffer"));
    s->grad_avg(tensor_field(f, "grad_avg"));
    return s;
  }
  if (dynamic_cast<o::Adagrad*>(&opt) != nullptr && has({"step", "sum"})) {
    auto s = std::make_unique<o::AdagradParamState>();
    s->step(int_field(f, "step"));
    s->sum(tensor_field(f, "sum"));
    return s;
  }
  return nullptr;
}

// Each state built directly where every one is of a known kind (no archive's copy of the tensors
// in and out): false, and nothing installed, otherwise.
bool install_known(torch::optim::Optimizer& opt, const std::vector<std::pair<std::string, StateFields>>& states) {
  std::unordered_map<std::string, const torch::Tensor*> params;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) params.emplace(archive_key(p), &p);
  }
  std::vector<std::pair<const torch::Tensor*, std::unique_ptr<torch::optim::OptimizerParamState>>> made;
  for (const auto& [key, fields] : states) {
    const auto it = params.find(key);
    auto state = it == params.end() ? nullptr : known_state(opt, fields);
    if (!state) return false;
    made.emplace_back(it->second, std::move(state));
  }
  for (auto& [p, state] : made) opt.state()[optimizer_state_key(opt, *p)] = std::move(state);
  return true;
}

}  // namespace

void install_states(torch::optim::Optimizer& opt, const std::vector<std::pair<std::string, StateFields>>& states) {
  if (states.empty() || install_known(opt, states)) return;
  ser::OutputArchive archive;
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  ser::OutputArchive state(archive.compilation_unit());
  for (const auto& [key, fields] : states) {
    ser::OutputArchive one(archive.compilation_unit());
    write_fields(one, fields);
    state.write(key, one);
  }
  archive.write("state", state);
  ser::OutputArchive groups(archive.compilation_unit());
  groups.write("param_groups/size", torch::tensor(static_cast<int64_t>(opt.param_groups().size())));
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& group = opt.param_groups()[g];
    ser::OutputArchive one(archive.compilation_unit());
    one.write("params/size", torch::tensor(static_cast<int64_t>(group.params().size())));
    for (size_t i = 0; i < group.params().size(); ++i) {
      one.write("params/" + std::to_string(i), c10::IValue(archive_key(group.params()[i])));
    }
    ser::OutputArchive options(archive.compilation_unit());
    group.options().serialize(options);
    one.write("options", options);
    groups.write("param_groups/" + std::to_string(g), one);
  }
  archive.write("param_groups", groups);
  const std::string bytes = bytes_of(archive);
  ser::InputArchive in;
  in.load_from(bytes.data(), bytes.size());
  opt.load(in);
}

}  // namespace dsgd::torch_glue
