// Sharded checkpoints (docs/CHECKPOINTS.md): every replica writes its own share of the state
// into a file of its own, the driver writes only the manifest, and any world, ZeRO stage and
// strategy loads it, each replica reading the byte ranges it needs. Torch-free: the shares
// arrive as regions of bytes (torch/state/state_share.h).
//
//   <dir>/manifest.json     the job's header, the files, and for each tensor its data type,
//                           shape and ranges (file, offset, elements, a CRC-32 per 4 MiB chunk);
//                           for each blob its file, offset, bytes and CRC-32s; its own CRC-32
//   <dir>/share-<rank>.bin  replica <rank>'s regions, each at a 4 KiB boundary; fsynced
//   <dir>/model.pt          as in the whole format (checkpoint.h), where written
//
// Written into a temporary directory beside <dir> and renamed into place once every file is
// durable (a directory that existed is swapped out and removed): a checkpoint on disk is whole
// or not there.
//
//   worker:  json files = write_share_file(tmp + "/share-00001.bin", replica.write_share(true));
//   driver:  auto m = make_manifest(header, {files of every replica}, world);
//            commit_sharded_checkpoint(tmp, dir, m, model_pt);
//   worker:  ShardReader reader(dir);  replica.read_share(reader);
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "torch/state/state_share.h"

namespace dsgd::runtime {

constexpr const char* kManifestFile = "manifest.json";
constexpr size_t kShareChunkBytes = 4u << 20;  // what each CRC-32 covers

// A file written through an aligned staging buffer with O_DIRECT where the file system takes it
// (else buffered, as on tmpfs): on this VM's disk buffered writes with fsync ran at 260 MB/s,
// direct ones at 1.2-1.7 GB/s. Each call throws dsgd::DataError naming the path.
//
//   StagedFile f(path);  f.put(data, n);  f.pad_to(4096);  ...  f.finish();  // fsynced, closed
class StagedFile {
 public:
  explicit StagedFile(std::string path);
  ~StagedFile();  // without finish(): closed, as written so far
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  uint64_t at() const { return written_ + fill_; }  // the bytes put
  void put(const char* data, size_t n);
  void pad_to(uint64_t align);  // zeros up to the next multiple of `align`
  void finish();                // the rest out, the length set to at(), fsynced, closed

 private:
  static constexpr size_t kStage = 16u << 20;
  void drain(size_t n);
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  const std::string path_;
  int fd_ = -1;
  bool direct_ = true;
  std::unique_ptr<char, Free> buf_;
  size_t fill_ = 0;
  uint64_t written_ = 0;
};

// "share-00003.bin"
std::string share_file_name(int rank);
// Writes `share` into `path` (created or truncated), fsynced; returns the file's record for the
// manifest ({"file", "bytes", "regions": [...]}). DataError naming the path when it cannot.
nlohmann::json write_share_file(const std::string& path, const torch_glue::StateShare& share);

// The manifest from `header` (the job's: checkpoint.h's fields) and every replica's file record:
// throws dsgd::Error where the tensors' ranges overlap or leave a gap (a share went missing).
nlohmann::json make_manifest(nlohmann::json header, const std::vector<nlohmann::json>& files, int world);
// A fresh temporary directory beside `dir`, for the shares; the same parent, so the commit's
// rename stays on one file system.
std::string sharded_temp_dir(const std::string& dir);
// Writes the manifest (and model.pt, if any) into `tmp`, fsyncs, and renames `tmp` to `dir`.
void commit_sharded_checkpoint(const std::string& tmp, const std::string& dir, const nlohmann::json& manifest,
                               const std::string& model_pickle);

bool is_sharded_checkpoint(const std::string& dir);  // holds a manifest
// The manifest, its CRC-32 checked; DataError naming the file where it is missing or damaged.
nlohmann::json read_manifest(const std::string& dir);
// Every share's file is there at its size (or DataError naming it): the cheap check before a
// load is sent to the workers.
void check_share_files(const std::string& dir, const nlohmann::json& manifest);

// A sharded checkpoint, read where asked: each range's 4 MiB chunks read whole and checked
// against their CRC-32 (DataError naming the file and offset otherwise), then the asked part
// copied out.
class ShardReader : public torch_glue::StateSource {
 public:
  explicit ShardReader(std::string dir);
  ~ShardReader() override;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const Tensor* find(const std::string& name) const override;
  std::vector<std::string> tensors_under(const std::string& prefix) const override;
  void read(const std::string& name, int64_t begin, int64_t count, void* dest) override;
  bool has_blob(const std::string& name) const override { return blobs_.count(name) > 0; }
  std::string blob(const std::string& name) override;
  int world() const override { return world_; }
  const nlohmann::json& manifest() const { return manifest_; }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Range {
    int file = 0;
    uint64_t offset = 0;  // in the file
    int64_t begin = 0, count = 0;
    std::vector<uint32_t> crcs;  // per chunk
  };
  struct Entry {
    Tensor tensor;
    size_t element = 0;         // bytes
    std::vector<Range> ranges;  // by begin
  };
  struct Blob {
    int file = 0;
    uint64_t offset = 0, bytes = 0;
    std::vector<uint32_t> crcs;  // per chunk
  };
  // Bytes [offset, offset + n) of file `file` into dest.
  void pread_file(int file, uint64_t offset, size_t n, char* dest);

  const std::string dir_;
  nlohmann::json manifest_;
  int world_ = 0;
  std::vector<std::string> files_;
  std::vector<int> fds_;  // opened at the first read (-1 until then)
  std::map<std::string, Entry> tensors_;
  std::map<std::string, Blob> blobs_;
  uint64_t bytes_read_ = 0;
};

}  // namespace dsgd::runtime
