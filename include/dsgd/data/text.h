// dsgd/data/text.h — text for language models: token files, and a dataset that streams one.
//
//   dsgd::data::write_token_file("train.tok", dsgd::data::encode_bytes(text), 256);
//   auto train = std::make_shared<dsgd::data::TokenDataset>("train.tok", /*context=*/128);
//   register_dataset(train);   // sample i: tokens [iT, iT + T] as data [T] and next-token target [T]
//
// A token file is a 32-byte header — "DSGDTOK1", uint32 bytes per token (1, 2 or 4), uint32 0,
// uint64 vocabulary size, uint64 token count, little-endian — then the tokens. TokenDataset maps
// the file into memory and copies out only the windows a batch asks for, then drops the pages it
// read from this process's memory (the page cache keeps them), so a worker's resident memory
// does not grow with the corpus. Reading throws dsgd::DataError naming the file and what is wrong
// (missing, not a token file, truncated, a token past the vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dsgd/torch/dataset.h"

namespace dsgd::data {

// The bytes of `text` as tokens 0..255 (a vocabulary of 256: every text encodes, nothing to train).
std::vector<int32_t> encode_bytes(std::string_view text);
std::string decode_bytes(const std::vector<int32_t>& tokens);

// Writes `tokens` (each in 0..vocab_size-1) as a token file at `path`, atomically (a temporary
// file renamed into place), in the fewest bytes per token the vocabulary allows.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size);

// Where Debian's dict-gcide package puts the Collaborative International Dictionary of English:
// 40 MB of plain English text (gzip-compatible dictzip), the corpus of the examples and benchmarks.
inline constexpr const char* kGcideDict = "/usr/share/dictd/gcide.dict.dz";

struct PreparedText {
  std::string train_path, val_path;  // <out_dir>/train.tok, <out_dir>/val.tok
  int64_t train_tokens = 0, val_tokens = 0;
};
// Tokenises the text file `input` (plain, or gzip/dictzip compressed) as bytes into
// <out_dir>/train.tok and <out_dir>/val.tok, holding out the last `val_fraction` of the text (cut
// at a line start) for validation. DataError naming the file if it cannot be read or is empty;
// ConfigError for val_fraction outside (0, 0.5].
PreparedText prepare_text(const std::string& input, const std::string& out_dir, double val_fraction = 0.01);

// A token file mapped read-only into memory.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return count_; }  // tokens
  int64_t vocab_size() const { return vocab_; }
  const std::string& path() const { return path_; }
  // Tokens [begin, begin + n) into out[0..n) as int64.
  void read(int64_t begin, int64_t n, int64_t* out) const;
  // Gives back the pages of tokens [begin, begin + n) (MADV_DONTNEED): they leave this
  // process's resident memory and are read again from the page cache when next needed.
  void release(int64_t begin, int64_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
  int width_ = 1;
  int64_t vocab_ = 0, count_ = 0;
};

// Sequences of `context` + 1 tokens from a token file: sample i is tokens [i * context, (i + 1) *
// context], data its first `context` tokens and target its last `context` (each position's next
// token), both int64 [context]. (size() - 1) / context samples; neighbours share one token.
class TokenDataset final : public Dataset {
 public:
  TokenDataset(const std::string& path, int64_t context);
  int64_t size() const override { return samples_; }
  Batch get_batch(const torch::Tensor& indices) const override;
  int64_t vocab_size() const { return file_.vocab_size(); }
  int64_t context() const { return context_; }

 private:
  TokenFile file_;
  int64_t context_;
  int64_t samples_;
};

}  // namespace dsgd::data
