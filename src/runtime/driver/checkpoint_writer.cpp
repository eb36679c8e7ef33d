#include "runtime/driver/checkpoint_writer.h"

#include <chrono>
#include <exception>
#include <utility>

#include "dsgd/common/error.h"

namespace dsgd::runtime {

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::submit(const Job& job, Checkpoint checkpoint, std::string model_pt) {
  if (thread_.joinable()) thread_.join();  // one at a time
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = true;
  }
  thread_ = std::thread([this, job, c = std::move(checkpoint), pt = std::move(model_pt)] {
    const auto t0 = std::chrono::steady_clock::now();
    Done d;
    d.job = job;
    d.bytes = c.state.size() + pt.size();
    try {
      d.path = write_rotating_checkpoint(root_, job.step, keep_, c, pt);
    } catch (const DataError& e) {
      d.error = e.what();
    } catch (const std::exception& e) {  // not the disk's: said all the same, never lost in the thread
      d.error = e.what();
    }
    d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mutex_);
    done_.push_back(std::move(d));
    running_ = false;
  });
}

std::vector<CheckpointWriter::Done> CheckpointWriter::take(bool wait) {
  if (wait && thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(done_, {});
}

bool CheckpointWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

}  // namespace dsgd::runtime
