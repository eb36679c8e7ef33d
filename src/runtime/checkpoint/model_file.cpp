// model.pt (runtime/checkpoint/model_file.h).
#include "runtime/checkpoint/model_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <vector>

#include "dsgd/torch/operator.h"
#include "dsgd/torch/self_contained_model.h"
#include "runtime/checkpoint/sharded_checkpoint.h"
#include "torch/state/replica_state.h"

namespace dsgd::runtime {

void write_model_file(const TrainingOperator& op, const std::string& path) {
  StagedFile out(path);
  if (const auto* whole = dynamic_cast<const SelfContainedModel*>(&op.model(0))) {
    const std::string bytes = whole->model_file();
    out.put(bytes.data(), bytes.size());
    out.finish();
    return;
  }
  c10::Dict<std::string, at::Tensor> dict;  // CPU tensors as they are: no step runs while this does
  for (auto& [name, t] : torch_glue::named_tensors(op)) dict.insert(name, t.detach().to(torch::kCPU));
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* p, size_t n) { pickle.insert(pickle.end(), p, p + n); });
  pickler.protocol();
  pickler.pushIValue(dict);
  pickler.stop();
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      out.put(static_cast<const char*>(data), n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  out.finish();
}

}  // namespace dsgd::runtime
