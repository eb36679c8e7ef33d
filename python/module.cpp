// dsgd._core: the Trainer for Python (pybind11). The Python side (python/dsgd/__init__.py) turns
// keywords into settings and models into TorchScript files; this file drives a dsgd::Trainer with
// them. Tensors never cross: models and checkpoints travel as the bytes torch.jit.load and
// torch.load read, so the module needs no libtorch_python (Debian's python3-torch runs on the same
// libtorch, /usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13, as this module does).
//
// The GIL is released while the driver waits on its workers. Ctrl-C: the progress callback
// (~10 times a second during train) checks Python's signals and stops the call with
// KeyboardInterrupt; the Trainer then shuts its workers down.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/nn/module.h>
#include <torch/serialize.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "dsgd/common/error.h"
#include "dsgd/runtime/fit.h"
#include "dsgd/apps/image_classifier.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/torch/self_contained_model.h"
#include "dsgd/runtime/settings.h"
#include "dsgd/runtime/trainer.h"
#include "dsgd/tune/tuner.h"

#if !defined(DSGD_WORKER_BINARY) || !defined(DSGD_INSTALLED_BINARY)
#error "DSGD_WORKER_BINARY and DSGD_INSTALLED_BINARY must name the dsgd executables (CMakeLists.txt)"
#endif

namespace py = pybind11;
using json = nlohmann::json;

namespace {

// What the workers run: $DSGD_WORKER_BINARY, else the dsgd this module was built beside, else
// the installed one, else dsgd in PATH (LaunchConfig::worker_binary looks it up).
std::string worker_binary() {
  if (const char* w = std::getenv("DSGD_WORKER_BINARY"); w != nullptr && *w != '\0') return w;
  for (const char* path : {DSGD_WORKER_BINARY, DSGD_INSTALLED_BINARY}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "dsgd";
}

// Raised from the progress callback when Python has a pending signal (its exception is set).
struct Interrupted : std::exception {};

// Python's signals checked on every batch (Ctrl-C), and each epoch handed to a Python callable.
class FitListener : public dsgd::ProgressListener {
 public:
  explicit FitListener(py::object on_epoch) : on_epoch_(std::move(on_epoch)) {}
  void on_batch(const dsgd::BatchProgress&) override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw Interrupted();
  }
  void on_epoch(const dsgd::EpochSummary& e) override {
    py::gil_scoped_acquire gil;
    if (on_epoch_.is_none()) return;
    dsgd::FitResult one;
    one.history = {e};
    const std::string text = dsgd::to_json(one)["history"][0].dump();
    on_epoch_(py::module_::import("json").attr("loads")(text));
  }

 private:
  py::object on_epoch_;
};

std::string results_json(const dsgd::Results& r) {
  json out = json::object();
  for (const auto& [k, v] : r.metrics) out[k] = v;
  out["epoch"] = r.epoch;
  out["batch"] = r.batch;
  out["batches_per_epoch"] = r.batches_per_epoch;
  out["recoveries"] = json::array();
  for (const auto& e : r.recoveries) out["recoveries"].push_back(dsgd::to_json(e));
  out["checkpoint_failures"] = r.checkpoint_failures;
  out["stragglers"] = json::array();
  for (const auto& s : r.stragglers) out["stragglers"].push_back(dsgd::to_json(s));
  return out.dump();
}

const char* operator_name(const std::string& op) {
  if (op != "language_model" && op != "image_classifier") {
    throw dsgd::ConfigError("operator must be 'image_classifier' or 'language_model', got '" + op + "'");
  }
  return op == "language_model" ? dsgd::kLanguageModel : dsgd::kImageClassifier;
}

dsgd::TrainerConfig config_of(const std::string& settings) {
  dsgd::register_builtin_operators();
  dsgd::TrainerConfig c;
  c.launch.worker_binary = worker_binary();
  dsgd::apply_settings(c, json::parse(settings));
  return c;
}

// dsgd.tune: a search over `space` (dsgd/tune/tuner.h) from the base settings; `options` names
// TuneOptions' fields. Returns TuneResult::to_json. (Ctrl-C is seen when the search returns: its
// trials run on threads of their own.)
std::string tune(const std::string& op, const std::string& settings, const std::string& space,
                 const std::string& options) {
  const dsgd::TrainerConfig base = config_of(settings);
  const json o = json::parse(options);
  dsgd::TuneOptions t;
  try {
    t.dir = o.value("dir", t.dir);
    t.num_trials = o.value("num_trials", t.num_trials);
    t.scheduler = o.value("scheduler", t.scheduler);
    t.cores = o.value("cores", t.cores);
    t.metric = o.value("metric", t.metric);
    t.mode = o.value("mode", t.mode);
    t.max_iterations = o.value("max_iterations", t.max_iterations);
    t.steps_per_iteration = o.value("steps_per_iteration", t.steps_per_iteration);
    t.grace_period = o.value("grace_period", t.grace_period);
    t.reduction_factor = o.value("reduction_factor", t.reduction_factor);
    t.perturbation_interval = o.value("perturbation_interval", t.perturbation_interval);
    t.quantile = o.value("quantile", t.quantile);
    t.resample_probability = o.value("resample_probability", t.resample_probability);
    t.seed = o.value("seed", t.seed);
  } catch (const json::exception& e) {
    throw dsgd::ConfigError(std::string("tune: an option has the wrong type: ") + e.what());
  }
  auto search = dsgd::SearchSpace::from_json(json::parse(space), "space");
  py::gil_scoped_release release;
  dsgd::Tuner tuner(operator_name(op), base, std::move(search), t);
  return tuner.run().to_json(t).dump();
}

class PyTrainer {
 public:
  // `settings`: apply_settings' JSON (dsgd/common/trainer_config.h); `op`: "image_classifier" or
  // "language_model".
  PyTrainer(const std::string& op, const std::string& settings) {
    dsgd::TrainerConfig c = config_of(settings);
    c.on_progress = [](const dsgd::TrainProgress&) {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) throw Interrupted();
    };
    const std::string name = operator_name(op);
    py::gil_scoped_release release;
    trainer_ = std::make_unique<dsgd::Trainer>(name, std::move(c));
  }

  std::string train(int64_t num_steps, bool profile) {
    return run([&] { return trainer().train({.num_steps = num_steps, .profile = profile}); });
  }
  std::string validate() {
    return run([&] { return trainer().validate(); });
  }
  // dsgd::fit over this Trainer: the run's summary as JSON (dsgd::to_json(FitResult)).
  std::string fit(int64_t epochs, int64_t max_steps, bool evaluate, bool profile, py::object on_epoch) {
    FitListener listener(std::move(on_epoch));
    dsgd::FitResult r;
    try {
      py::gil_scoped_release release;
      const auto start = std::chrono::steady_clock::now();
      r = dsgd::fit(trainer(), {.epochs = epochs, .max_steps = max_steps, .evaluate = evaluate, .profile = profile},
                    &listener);
      r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } catch (const Interrupted&) {
      shutdown();
      throw py::error_already_set();
    } catch (const py::error_already_set&) {  // the callback raised: stop, as Ctrl-C does
      shutdown();
      throw;
    }
    return dsgd::to_json(r).dump();
  }
  // A registered worker function on each worker's first replica, or on every replica: the
  // results as a JSON array (Trainer::foreach_worker, foreach_model).
  std::string foreach(const std::string& name, const std::string& arg_json, bool every_replica) {
    const auto arg = nlohmann::json::parse(arg_json);
    py::gil_scoped_release release;
    const auto out = every_replica ? trainer().foreach_model(name, arg) : trainer().foreach_worker(name, arg);
    return nlohmann::json(out).dump();
  }
  void save(const std::string& path) {
    py::gil_scoped_release release;
    trainer().save(path);
  }
  void load(const std::string& path) {
    py::gil_scoped_release release;
    trainer().load(path);
  }
  // Model 0 as bytes: a TorchScript module's file, or a name -> tensor dict (torch.load).
  py::bytes model_bytes() {
    std::string bytes;
    {
      py::gil_scoped_release release;
      auto model = trainer().get_model();
      if (const auto* whole = dynamic_cast<const dsgd::SelfContainedModel*>(model.get())) {
        bytes = whole->model_file();
      } else {
        c10::Dict<std::string, at::Tensor> dict;
        for (const auto& p : model->named_parameters()) dict.insert(p.key(), p.value().detach().clone());
        for (const auto& b : model->named_buffers()) dict.insert(b.key(), b.value().detach().clone());
        const auto pickled = torch::pickle_save(dict);
        bytes.assign(pickled.begin(), pickled.end());
      }
    }
    return py::bytes(bytes);
  }
  void shutdown() {
    if (!trainer_) return;
    py::gil_scoped_release release;
    trainer_->shutdown();
    trainer_.reset();
  }

 private:
  dsgd::Trainer& trainer() {
    if (!trainer_) throw dsgd::ConfigError("this Trainer was shut down (or interrupted); make a new one");
    return *trainer_;
  }
  template <typename F>
  std::string run(F&& call) {
    dsgd::Results r;
    try {
      py::gil_scoped_release release;
      r = call();
    } catch (const Interrupted&) {
      shutdown();  // no worker left behind; Python's KeyboardInterrupt is set
      throw py::error_already_set();
    }
    return results_json(r);
  }
  std::unique_ptr<dsgd::Trainer> trainer_;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dsgd's C++ core (use the dsgd package)";
  static py::exception<dsgd::Error> error(m, "Error", PyExc_RuntimeError);
  // A bad setting is also a ValueError, as Python's own bad arguments are.
  static py::tuple config_bases = py::make_tuple(error, py::handle(PyExc_ValueError));
  static py::exception<dsgd::ConfigError> config_error(m, "ConfigError", config_bases.ptr());
  static py::exception<dsgd::TimeoutError> timeout_error(m, "TimeoutError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dsgd::ConfigError& e) {
      config_error(e.what());
    } catch (const dsgd::TimeoutError& e) {
      timeout_error(e.what());
    } catch (const dsgd::Error& e) {
      error(e.what());
    }
  });
  m.def("setting_names", &dsgd::setting_names, "Every TrainerConfig field's path");
  m.def("setting_groups", &dsgd::setting_groups, "The groups of TrainerConfig's fields: step, comm, ...");
  m.def("tune", &tune, py::arg("operator"), py::arg("settings"), py::arg("space"), py::arg("options"));
  py::class_<PyTrainer>(m, "Trainer")
      .def(py::init<const std::string&, const std::string&>(), py::arg("operator"), py::arg("settings"))
      .def("train", &PyTrainer::train, py::arg("num_steps") = 0, py::arg("profile") = false)
      .def("validate", &PyTrainer::validate)
      .def("fit", &PyTrainer::fit, py::arg("epochs"), py::arg("max_steps"), py::arg("evaluate"), py::arg("profile"),
           py::arg("on_epoch"))
      .def("foreach", &PyTrainer::foreach, py::arg("name"), py::arg("arg_json"), py::arg("every_replica"))
      .def("save", &PyTrainer::save, py::arg("path"))
      .def("load", &PyTrainer::load, py::arg("path"))
      .def("model_bytes", &PyTrainer::model_bytes)
      .def("shutdown", &PyTrainer::shutdown);
}
