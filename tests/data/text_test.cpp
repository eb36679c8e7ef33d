// Token files and the streaming TokenDataset: round trips at each token width, the windows a
// batch gets, clear errors, and resident memory that does not grow with the corpus.
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <numeric>
#include <random>

#include "dsgd/common/error.h"
#include "dsgd/data/text.h"
#include "testing/temp_dir.h"

namespace dsgd::data {
namespace {

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> out(n);
  for (auto& t : out) t = d(gen);
  return out;
}

TEST(TokenFile, RoundTripsAtEachWidth) {
  testing::TempDir dir;
  for (int64_t vocab : {256, 5000, 70000}) {
    const auto tokens = random_tokens(1001, vocab, static_cast<uint32_t>(vocab));
    const auto path = dir.file("t" + std::to_string(vocab));
    write_token_file(path, tokens, vocab);
    TokenFile f(path);
    EXPECT_EQ(f.size(), 1001);
    EXPECT_EQ(f.vocab_size(), vocab);
    std::vector<int64_t> back(1001);
    f.read(0, 1001, back.data());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), tokens.begin())) << "vocab " << vocab;
  }
  EXPECT_EQ(decode_bytes(encode_bytes("In the beginning\n\xc3\xa9")), "In the beginning\n\xc3\xa9");
}

TEST(TokenDataset, SampleIIsTheWindowAtIContextWithItsNextTokens) {
  testing::TempDir dir;
  std::vector<int32_t> tokens(103);
  std::iota(tokens.begin(), tokens.end(), 0);
  write_token_file(dir.file("t"), tokens, 256);
  TokenDataset d(dir.file("t"), 10);
  EXPECT_EQ(d.size(), 10);  // (103 - 1) / 10
  const auto b = d.get_batch(torch::tensor({7, 0, 9}, torch::kInt64));
  ASSERT_EQ(b.data.sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_TRUE(b.data[0].equal(torch::arange(70, 80, torch::kInt64)));
  EXPECT_TRUE(b.target[0].equal(torch::arange(71, 81, torch::kInt64)));
  EXPECT_TRUE(b.data[1].equal(torch::arange(0, 10, torch::kInt64)));
  EXPECT_TRUE(b.target[2].equal(torch::arange(91, 101, torch::kInt64)));
  EXPECT_THROW(d.get_batch(torch::tensor({10}, torch::kInt64)), DataError);
}

void expect_data_error(const std::function<void()>& f, const std::string& says) {
  try {
    f();
    FAIL() << "no DataError; expected one saying '" << says << "'";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(TokenFile, BadFilesAreClearErrorsNamingTheFile) {
  testing::TempDir dir;
  expect_data_error([&] { TokenFile f(dir.file("missing")); }, "missing: cannot open");
  std::ofstream(dir.file("text")) << "plain text, not tokens, but longer than a header is\n";
  expect_data_error([&] { TokenFile f(dir.file("text")); }, "not a token file");
  write_token_file(dir.file("cut"), random_tokens(100, 256, 1), 256);
  std::filesystem::resize_file(dir.file("cut"), 32 + 50);
  expect_data_error([&] { TokenFile f(dir.file("cut")); }, "truncated: 100 tokens need 132 bytes, the file has 82");
  expect_data_error([&] { write_token_file(dir.file("bad"), {1, 300}, 256); }, "token 1 is 300");
  expect_data_error([&] { TokenDataset d(dir.file("cut.short"), 8); }, "cannot open");
  write_token_file(dir.file("short"), {1, 2, 3}, 256);
  expect_data_error([&] { TokenDataset d(dir.file("short"), 8); }, "fewer than one sequence of 9");
}

// prepare_text: a gzip-compressed text (as dict-gcide's) becomes train and validation token
// files whose bytes are the text's, the validation part its last lines.
TEST(PrepareText, SplitsACompressedTextIntoTrainAndValidationTokens) {
  testing::TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "entry " + std::to_string(i) + ": a word and its meaning\n";
  gzFile gz = ::gzopen(dir.file("words.gz").c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(::gzwrite(gz, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ::gzclose(gz);
  const auto p = prepare_text(dir.file("words.gz"), dir.file("out"), 0.1);
  EXPECT_EQ(p.train_tokens + p.val_tokens, static_cast<int64_t>(text.size()));
  EXPECT_NEAR(static_cast<double>(p.val_tokens), 0.1 * static_cast<double>(text.size()), 40.0);
  std::string back;
  for (const auto& path : {p.train_path, p.val_path}) {
    TokenFile f(path);
    std::vector<int64_t> t(static_cast<size_t>(f.size()));
    f.read(0, f.size(), t.data());
    back += decode_bytes(std::vector<int32_t>(t.begin(), t.end()));
  }
  EXPECT_EQ(back, text);
  EXPECT_EQ(text[static_cast<size_t>(p.train_tokens) - 1], '\n') << "validation starts at a line";
  expect_data_error([&] { prepare_text(dir.file("none.txt"), dir.file("out"), 0.1); }, "none.txt: cannot open");
  EXPECT_THROW(prepare_text(dir.file("words.gz"), dir.file("out"), 0.9), ConfigError);
}

int64_t resident_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Reads every sample of a 16 MB and a 64 MB corpus in batches of 64: resident memory does not
// grow with the corpus (the pages a batch read are given back). Without the release it grew by
// 18 and 63 MB.
TEST(TokenDataset, ResidentMemoryDoesNotGrowWithTheCorpus) {
  testing::TempDir dir;
  std::vector<int64_t> grew;
  for (size_t mb : {16, 64}) {
    const auto path = dir.file("corpus" + std::to_string(mb));
    std::vector<int32_t> tokens(mb << 20);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 2654435761u) >> 24 & 255);
    write_token_file(path, tokens, 256);
    tokens = {};
    TokenDataset d(path, 1024);
    d.get_batch(torch::arange(0, 64, torch::kInt64));  // the batch's own memory, once
    const int64_t before = resident_kb();
    int64_t peak = before;
    for (int64_t s = 0; s < d.size(); s += 64) {
      d.get_batch(torch::arange(s, std::min(d.size(), s + 64), torch::kInt64));
      if (s % 4096 == 0) peak = std::max(peak, resident_kb());
    }
    peak = std::max(peak, resident_kb());
    std::printf("%zu MB corpus: resident memory grew by %lld kB\n", mb, static_cast<long long>(peak - before));
    EXPECT_LT(peak - before, 8 * 1024) << mb << " MB corpus";
    grew.push_back(peak - before);
  }
  EXPECT_LE(grew[1], grew[0] + 1024) << "4x the corpus, more memory";
}

}  // namespace
}  // namespace dsgd::data
