#include "framework/serialize.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "framework/random.h"
#include "tests/scratch_path.h"

namespace stillpoint::serialize_test {
namespace {

namespace fs = std::filesystem;

// Runs statement, expects a stillpoint::Error, and returns its message ("" if
// nothing was thrown, which also records a failure).
template <typename Fn>
std::string ErrorMessage(Fn&& statement) {
  try {
    statement();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a stillpoint::Error";
  return "";
}

#define EXPECT_CONTAINS(text, fragment)                          \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos) \
      << "text: " << (text) << "\nmissing: " << (fragment)

// A fresh directory per test, removed afterwards.
class SerializeTest : public testing_support::ScratchDirTest {
 protected:
  SerializeTest() : ScratchDirTest("serialize") {}

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static void WriteRaw(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
};

// Bitwise equality of names, dtypes, shapes and values (so NaN and -0 count).
void ExpectSameTensors(const NamedTensors& expected, const NamedTensors& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, want] = expected[i];
    const auto& [got_name, got] = actual[i];
    EXPECT_EQ(got_name, name);
    EXPECT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(got.shape(), want.shape()) << name;
    if (got.dtype() != want.dtype() || got.shape() != want.shape()) continue;
    DispatchDType(want.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (want.numel() == 0) return;
      EXPECT_EQ(std::memcmp(got.template data<T>(), want.template data<T>(), want.nbytes()), 0)
          << name;
    });
  }
}

// Every rank from 0 to 4, both dtypes, empty extents, a view, and values
// that a lossy format would mangle.
NamedTensors SampleTensors() {
  Rng rng(3);
  NamedTensors tensors;
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const std::string suffix = dtype == DType::kFloat32 ? "_f32" : "_f64";
    tensors.emplace_back("scalar" + suffix, Tensor::Scalar(-0.0, dtype));
    tensors.emplace_back(
        "vector" + suffix,
        Tensor::FromVector({6},
                           {1.0, -2.5, std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN(), 1e-310, 3.0e38},
                           dtype));
    tensors.emplace_back("matrix" + suffix, RandomNormal({3, 5}, 0.0, 1.0, dtype, rng));
    tensors.emplace_back("rank3" + suffix, RandomNormal({2, 3, 4}, 0.0, 1.0, dtype, rng));
    tensors.emplace_back("rank4" + suffix, RandomNormal({2, 1, 3, 2}, 0.0, 1.0, dtype, rng));
    tensors.emplace_back("empty1" + suffix, Tensor(Shape{0}, dtype));
    tensors.emplace_back("empty3" + suffix, Tensor(Shape{2, 0, 3}, dtype));
  }
  Tensor big = RandomNormal({5, 4}, 0.0, 1.0, DType::kFloat32, rng);
  tensors.emplace_back("cells.0.attn.rows_1_to_3", big.SliceRows(1, 3));
  tensors.emplace_back("ünïcode name", Tensor::Ones({1}, DType::kFloat64));
  return tensors;
}

TEST_F(SerializeTest, FileRoundTripKeepsEverythingBitwise) {
  const NamedTensors tensors = SampleTensors();
  const std::string path = Path("tensors.sp");
  SaveTensors(path, tensors);
  ExpectSameTensors(tensors, LoadTensors(path));
  EXPECT_FALSE(fs::exists(TemporaryPathFor(path)));
}

TEST_F(SerializeTest, BytesRoundTripAndEmptyList) {
  const NamedTensors tensors = SampleTensors();
  ExpectSameTensors(tensors, DeserializeTensors(SerializeTensors(tensors), "memory"));
  const std::string empty = SerializeTensors({});
  EXPECT_EQ(empty.size(), 36u);  // header and checksum only
  EXPECT_TRUE(DeserializeTensors(empty, "memory").empty());
}

TEST_F(SerializeTest, LoadedTensorsOwnTheirStorage) {
  Tensor t = Tensor::Ones({3}, DType::kFloat32);
  NamedTensors loaded = DeserializeTensors(SerializeTensors({{"t", t}}), "memory");
  loaded[0].second.set(0, 5.0);
  EXPECT_EQ(t.at(0), 1.0);
}

// The exact bytes of a small record, so an accidental format change fails.
TEST_F(SerializeTest, GoldenBytes) {
  const std::string bytes =
      SerializeTensors({{"ab", Tensor::FromVector({2}, {1.0, -2.0}, DType::kFloat32)}});
  std::string expected("STILLPT1", 8);
  const unsigned char body[] = {
      1,    0,    0,    0,                            // version 1
      63,   0,    0,    0,    0,    0,    0,    0,    // total length 63
      1,    0,    0,    0,    0,    0,    0,    0,    // 1 entry
      2,    0,    0,    0,    'a',  'b',              // name "ab"
      1,                                              // float32
      1,    0,    0,    0,                            // rank 1
      2,    0,    0,    0,    0,    0,    0,    0,    // extent 2
      0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0  // 1.0f, -2.0f
  };
  expected.append(reinterpret_cast<const char*>(body), sizeof(body));
  const uint64_t checksum = Fnv1a64(expected.data(), expected.size());
  for (int i = 0; i < 8; ++i) expected.push_back(static_cast<char>((checksum >> (8 * i)) & 0xff));
  ASSERT_EQ(bytes.size(), 63u);
  EXPECT_EQ(bytes, expected);
}

TEST(Fnv1a64Test, KnownVectors) {
  EXPECT_EQ(Fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  // Continuing a hash equals hashing the concatenation.
  EXPECT_EQ(Fnv1a64("bar", 3, Fnv1a64("foo", 3)), Fnv1a64("foobar", 6));
}

TEST_F(SerializeTest, CorruptedDataByteIsAChecksumError) {
  const std::string path = Path("corrupt.sp");
  SaveTensors(path, {{"w", Tensor::Ones({4, 4}, DType::kFloat64)}});
  std::string bytes = ReadFileBytes(path);
  bytes[bytes.size() - 8 - 13] ^= 0x10;  // inside w's values
  WriteRaw(path, bytes);
  const std::string message = ErrorMessage([&] { LoadTensors(path); });
  EXPECT_CONTAINS(message, "checksum mismatch");
  EXPECT_CONTAINS(message, path);
}

TEST_F(SerializeTest, CorruptedNameOrChecksumIsAChecksumError) {
  const std::string good = SerializeTensors({{"weight", Tensor::Ones({2}, DType::kFloat32)}});
  for (const std::size_t offset : {std::size_t{34}, good.size() - 1}) {
    std::string bad = good;
    bad[offset] ^= 0x01;
    EXPECT_CONTAINS(ErrorMessage([&] { DeserializeTensors(bad, "ckpt"); }), "checksum mismatch");
  }
}

TEST_F(SerializeTest, TruncatedFilesSayTruncated) {
  const std::string path = Path("full.sp");
  SaveTensors(path, {{"a", Tensor::Ones({3, 2}, DType::kFloat32)},
                     {"b", Tensor::Zeros({2}, DType::kFloat64)}});
  const std::string bytes = ReadFileBytes(path);
  const std::string cut_path = Path("cut.sp");
  // Inside the magic, the version, the length, the count, the first name,
  // the data, the second entry and the checksum.
  for (const std::size_t size : {std::size_t{0}, std::size_t{3}, std::size_t{8}, std::size_t{15},
                                 std::size_t{20}, std::size_t{27}, std::size_t{31}, std::size_t{50},
                                 bytes.size() - 20, bytes.size() - 8, bytes.size() - 1}) {
    WriteRaw(cut_path, bytes.substr(0, size));
    const std::string message = ErrorMessage([&] { LoadTensors(cut_path); });
    EXPECT_CONTAINS(message, "truncated") << " at size " << size;
    EXPECT_CONTAINS(message, cut_path) << " at size " << size;
  }
}

TEST_F(SerializeTest, WrongMagicAndUnknownVersion) {
  std::string bytes = SerializeTensors({{"x", Tensor::Ones({1}, DType::kFloat32)}});
  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  const std::string path = Path("magic.sp");
  WriteRaw(path, wrong_magic);
  std::string message = ErrorMessage([&] { LoadTensors(path); });
  EXPECT_CONTAINS(message, "wrong magic");
  EXPECT_CONTAINS(message, "XTILLPT1");
  EXPECT_CONTAINS(message, path);

  // Not a tensor file at all (shorter than the magic, and different).
  EXPECT_CONTAINS(ErrorMessage([&] { DeserializeTensors("{}\n", "config.json"); }), "wrong magic");

  std::string future = bytes;
  future[8] = 2;
  message = ErrorMessage([&] { DeserializeTensors(future, "future.sp"); });
  EXPECT_CONTAINS(message, "unsupported format version 2");
  EXPECT_CONTAINS(message, "future.sp");
}

// Rewrites the checksum so that a deliberately inconsistent record gets past
// the checksum and exercises the structural checks.
std::string WithValidChecksum(std::string bytes) {
  const std::size_t body = bytes.size() - 8;
  const uint64_t checksum = Fnv1a64(bytes.data(), body);
  for (int i = 0; i < 8; ++i) bytes[body + i] = static_cast<char>((checksum >> (8 * i)) & 0xff);
  return bytes;
}

void PutU64(std::string* bytes, std::size_t offset, uint64_t value) {
  for (int i = 0; i < 8; ++i) (*bytes)[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

TEST_F(SerializeTest, AbsurdRankSizeAndCountAreErrors) {
  // One entry "w" of shape [2, 3], float32: name length at 28, name at 32,
  // dtype at 33, rank at 34, extents at 38 and 46, data at 54.
  const std::string good = SerializeTensors({{"w", Tensor::Ones({2, 3}, DType::kFloat32)}});

  std::string rank = good;
  rank[34] = 9;
  std::string message = ErrorMessage([&] { DeserializeTensors(WithValidChecksum(rank), "r"); });
  EXPECT_CONTAINS(message, "rank 9");
  EXPECT_CONTAINS(message, "'w'");

  std::string huge = good;
  PutU64(&huge, 38, uint64_t{1} << 40);
  message = ErrorMessage([&] { DeserializeTensors(WithValidChecksum(huge), "h"); });
  EXPECT_CONTAINS(message, "'w'");
  EXPECT_CONTAINS(message, "needs");

  std::string overflow = good;
  PutU64(&overflow, 38, uint64_t{1} << 40);
  PutU64(&overflow, 46, uint64_t{1} << 40);
  message = ErrorMessage([&] { DeserializeTensors(WithValidChecksum(overflow), "o"); });
  EXPECT_CONTAINS(message, "absurd size");

  std::string negative = good;
  PutU64(&negative, 46, static_cast<uint64_t>(-3));
  message = ErrorMessage([&] { DeserializeTensors(WithValidChecksum(negative), "n"); });
  EXPECT_CONTAINS(message, "negative extent -3");

  std::string count = good;
  PutU64(&count, 20, uint64_t{1} << 50);
  message = ErrorMessage([&] { DeserializeTensors(WithValidChecksum(count), "c"); });
  EXPECT_CONTAINS(message, "entry count");

  std::string dtype = good;
  dtype[33] = 7;
  message = ErrorMessage([&] { DeserializeTensors(WithValidChecksum(dtype), "d"); });
  EXPECT_CONTAINS(message, "dtype code 7");

  std::string length = good;
  PutU64(&length, 12, 10);
  message = ErrorMessage([&] { DeserializeTensors(length, "l"); });
  EXPECT_CONTAINS(message, "length of 10");
}

TEST_F(SerializeTest, TrailingBytesAreAnError) {
  const std::string bytes = SerializeTensors({{"x", Tensor::Ones({1}, DType::kFloat32)}});
  const std::string message = ErrorMessage([&] { DeserializeTensors(bytes + "junk", "t.sp"); });
  EXPECT_CONTAINS(message, "4 unexpected bytes");
  EXPECT_CONTAINS(message, "t.sp");
}

TEST_F(SerializeTest, MissingFileNamesThePath) {
  const std::string path = Path("does_not_exist.sp");
  const std::string message = ErrorMessage([&] { LoadTensors(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "No such file");
  EXPECT_CONTAINS(ErrorMessage([&] { LoadTensors(dir_.string()); }), "directory");
}

TEST_F(SerializeTest, SaveIntoMissingDirectoryLeavesNothing) {
  const std::string path = Path("no_such_dir/model.sp");
  const std::string message = ErrorMessage([&] {
    SaveTensors(path, {{"x", Tensor::Ones({1}, DType::kFloat32)}});
  });
  EXPECT_CONTAINS(message, path);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(TemporaryPathFor(path)));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SerializeTest, FailedSaveNeverDamagesTheExistingFile) {
  const std::string path = Path("model.sp");
  const NamedTensors original = {{"x", Tensor::Ones({2}, DType::kFloat32)}};
  SaveTensors(path, original);
  const std::string before = ReadFileBytes(path);

  // The temporary cannot be created (a directory is in the way).
  fs::create_directory(TemporaryPathFor(path));
  EXPECT_CONTAINS(ErrorMessage([&] {
                    SaveTensors(path, {{"x", Tensor::Zeros({2}, DType::kFloat32)}});
                  }),
                  TemporaryPathFor(path));
  EXPECT_EQ(ReadFileBytes(path), before);
  fs::remove(TemporaryPathFor(path));

  // Invalid input fails before anything is written.
  EXPECT_CONTAINS(ErrorMessage([&] {
                    SaveTensors(path, {{"x", Tensor::Zeros({2}, DType::kFloat32)},
                                       {"x", Tensor::Zeros({2}, DType::kFloat32)}});
                  }),
                  "appears twice");
  EXPECT_EQ(ReadFileBytes(path), before);
  EXPECT_FALSE(fs::exists(TemporaryPathFor(path)));
}

TEST_F(SerializeTest, FailedRenameRemovesTheTemporary) {
  // The destination is a non-empty directory, so the rename fails after the
  // temporary was written.
  const std::string path = Path("occupied");
  fs::create_directories(fs::path(path) / "inside");
  const std::string message = ErrorMessage([&] {
    SaveTensors(path, {{"x", Tensor::Ones({1}, DType::kFloat32)}});
  });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "renaming");
  EXPECT_FALSE(fs::exists(TemporaryPathFor(path)));
  EXPECT_TRUE(fs::is_directory(fs::path(path) / "inside"));
}

// Two processes saving one file (two runs in one directory): with a shared
// temporary name, one renamed or truncated the other's temporary and died
// with "renaming ... failed" at random. Each writer now has its own.
TEST_F(SerializeTest, TwoProcessesSavingOneFileBothSucceed) {
  const std::string path = Path("shared.sp");
  const std::string payload(1 << 16, 'x');
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int failures = 0;
    for (int i = 0; i < 100; ++i) {
      try {
        WriteFileAtomically(path, payload + "child");
      } catch (const Error&) {
        ++failures;
      }
    }
    ::_exit(failures == 0 ? 0 : 1);
  }
  int failures = 0;
  for (int i = 0; i < 100; ++i) {
    try {
      WriteFileAtomically(path, payload + "parent");
    } catch (const Error&) {
      ++failures;
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(failures, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's saves failed";
  const std::string content = ReadFileBytes(path);
  EXPECT_TRUE(content == payload + "child" || content == payload + "parent");
  EXPECT_NE(TemporaryPathFor(path), path + ".tmp");
}

TEST_F(SerializeTest, SaveReplacesAnExistingFile) {
  const std::string path = Path("model.sp");
  SaveTensors(path, {{"x", Tensor::Ones({2}, DType::kFloat32)}});
  const NamedTensors second = {{"y", Tensor::Full({3}, 4.0, DType::kFloat64)}};
  SaveTensors(path, second);
  ExpectSameTensors(second, LoadTensors(path));
  EXPECT_FALSE(fs::exists(TemporaryPathFor(path)));
}

TEST_F(SerializeTest, RejectsInvalidEntries) {
  EXPECT_CONTAINS(ErrorMessage([&] {
                    SerializeTensors({{"", Tensor::Ones({1}, DType::kFloat32)}});
                  }),
                  "empty name");
  EXPECT_CONTAINS(ErrorMessage([&] { SerializeTensors({{"u", Tensor()}}); }), "'u'");
  const std::string long_name(kMaxTensorNameLength + 1, 'n');
  EXPECT_CONTAINS(ErrorMessage([&] {
                    SerializeTensors({{long_name, Tensor::Ones({1}, DType::kFloat32)}});
                  }),
                  "limit");
}

TEST_F(SerializeTest, StreamsHoldSeveralRecords) {
  const NamedTensors first = {{"a", Tensor::Ones({2, 2}, DType::kFloat32)}};
  const NamedTensors second = SampleTensors();
  std::stringstream stream;
  stream << "header line\n";
  WriteTensors(stream, first);
  WriteTensors(stream, second);
  stream << "after";

  std::string line;
  std::getline(stream, line);
  ASSERT_EQ(line, "header line");
  ExpectSameTensors(first, ReadTensors(stream, "stream"));
  ExpectSameTensors(second, ReadTensors(stream, "stream"));
  std::string rest;
  stream >> rest;
  EXPECT_EQ(rest, "after");
}

TEST_F(SerializeTest, TruncatedStreamSaysTruncated) {
  const std::string bytes = SerializeTensors({{"a", Tensor::Ones({8}, DType::kFloat64)}});
  for (const std::size_t size : {std::size_t{5}, std::size_t{25}, bytes.size() - 1}) {
    std::istringstream stream(bytes.substr(0, size));
    const std::string message = ErrorMessage([&] { ReadTensors(stream, "ckpt.bin"); });
    EXPECT_CONTAINS(message, "truncated") << " at size " << size;
    EXPECT_CONTAINS(message, "ckpt.bin");
  }
}

class TinyNet : public Module {
 public:
  explicit TinyNet(int64_t width) {
    Rng rng(static_cast<uint64_t>(width) * 7 + 1);
    w_ = RegisterParameter("w", RandomNormal({3, width}, 0.0, 1.0, DType::kFloat32, rng));
    auto child = std::make_shared<Module>();
    child->RegisterParameter("b", RandomNormal({width}, 0.0, 1.0, DType::kFloat32, rng));
    RegisterModule("child", child);
  }
  std::string Name() const override { return "TinyNet"; }

 private:
  Var w_;
};

TEST_F(SerializeTest, ModuleRoundTrip) {
  const std::string path = Path("net.sp");
  TinyNet saved(4);
  SaveModule(path, saved);
  TinyNet loaded(4);
  Rng rng(99);
  loaded.parameter("w").mutable_value().CopyFrom(
      RandomNormal({3, 4}, 0.0, 1.0, DType::kFloat32, rng));
  LoadModule(path, &loaded);
  for (const auto& [name, p] : saved.named_parameters()) {
    EXPECT_EQ(MaxAbsDiff(p.value(), loaded.parameter(name).value()), 0.0) << name;
  }
  // Also through bytes, as a checkpoint would embed it.
  TinyNet from_bytes(4);
  DeserializeModule(SerializeModule(saved), "checkpoint", &from_bytes);
  EXPECT_EQ(MaxAbsDiff(from_bytes.parameter("child.b").value(), saved.parameter("child.b").value()),
            0.0);
}

TEST_F(SerializeTest, ModuleShapeMismatchNamesFileAndParameter) {
  const std::string path = Path("net.sp");
  SaveModule(path, TinyNet(4));
  TinyNet other(5);
  const Tensor before = other.parameter("w").value().Clone();
  const std::string message = ErrorMessage([&] { LoadModule(path, &other); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "'w'");
  EXPECT_CONTAINS(message, "[3, 5]");
  EXPECT_CONTAINS(message, "[3, 4]");
  EXPECT_EQ(MaxAbsDiff(other.parameter("w").value(), before), 0.0);
}

}  // namespace
}  // namespace stillpoint::serialize_test
