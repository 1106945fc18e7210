#include "training/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "framework/serialize.h"
#include "tests/scratch_path.h"

namespace stillpoint::checkpoint_test {
namespace {

CheckpointState SampleState() {
  CheckpointState state;
  state.step = 42;
  state.data_epoch = 3;
  state.data_offset = 17;
  state.rng_state = "1 2 3 4";
  state.config_yaml = "seed: 1\ntask:\n  kind: reverse\n";
  state.model = {{"w", Tensor::FromVector(Shape{2, 2}, {1, 2, 3, 4}, DType::kFloat32)},
                 {"b", Tensor::FromVector(Shape{2}, {0.5, -0.5}, DType::kFloat64)}};
  state.optimizer = {{"step", Tensor::Scalar(42, DType::kFloat64)}};
  state.solver_state = {{"warm_start/replica0", Tensor::FromVector(Shape{1, 3}, {1, -2, 3},
                                                                   DType::kFloat32)}};
  return state;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_support::ScratchPathForThisTest("ckpt");
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "last.ckpt").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string ErrorLoading(const std::string& bytes) {
    try {
      DeserializeCheckpoint(bytes, "mem");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(CheckpointTest, RoundTripKeepsEverything) {
  SaveCheckpoint(path_, SampleState());
  CheckpointState loaded = LoadCheckpoint(path_);
  EXPECT_EQ(loaded.step, 42);
  EXPECT_EQ(loaded.data_epoch, 3);
  EXPECT_EQ(loaded.data_offset, 17);
  EXPECT_EQ(loaded.rng_state, "1 2 3 4");
  EXPECT_EQ(loaded.config_yaml, SampleState().config_yaml);
  ASSERT_EQ(loaded.model.size(), 2u);
  EXPECT_EQ(loaded.model[0].first, "w");
  EXPECT_EQ(loaded.model[0].second.ToVector(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(loaded.model[1].second.dtype(), DType::kFloat64);
  ASSERT_EQ(loaded.solver_state.size(), 1u);
  EXPECT_EQ(loaded.solver_state[0].first, "warm_start/replica0");
  EXPECT_EQ(loaded.solver_state[0].second.ToVector(), (std::vector<double>{1, -2, 3}));
  EXPECT_FALSE(std::filesystem::exists(TemporaryPathFor(path_)));
}

TEST_F(CheckpointTest, EveryCorruptedByteIsDetected) {
  const std::string good = SerializeCheckpoint(SampleState());
  for (std::size_t i = 0; i < good.size(); i += 7) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    EXPECT_FALSE(ErrorLoading(bad).empty()) << "corruption at byte " << i << " went unnoticed";
  }
  std::string bad = good;
  bad[good.size() / 2] ^= 1;
  EXPECT_NE(ErrorLoading(bad).find("checksum mismatch"), std::string::npos);
}

TEST_F(CheckpointTest, TruncationIsReportedAsSuch) {
  const std::string good = SerializeCheckpoint(SampleState());
  for (std::size_t keep : {good.size() - 1, good.size() / 2, std::size_t{30}}) {
    const std::string message = ErrorLoading(good.substr(0, keep));
    EXPECT_NE(message.find("truncated"), std::string::npos) << keep << ": " << message;
  }
  EXPECT_NE(ErrorLoading("STILLPT1 something else").find("wrong magic"), std::string::npos);
}

TEST_F(CheckpointTest, AFailedSaveLeavesThePreviousCheckpointIntact) {
  SaveCheckpoint(path_, SampleState());
  const std::string before = ReadFileBytes(path_);
  // Make the temporary file impossible to create: a directory in its place.
  std::filesystem::create_directories(TemporaryPathFor(path_));
  CheckpointState next = SampleState();
  next.step = 43;
  EXPECT_THROW(SaveCheckpoint(path_, next), Error);
  EXPECT_EQ(ReadFileBytes(path_), before);
  EXPECT_EQ(LoadCheckpoint(path_).step, 42);
}

// A checksummed checkpoint whose metadata is wrong: a negative step was
// accepted and logged as "step -5/20".
TEST_F(CheckpointTest, NegativeCountsInTheMetadataAreRefused) {
  for (const char* field : {"step", "data_epoch", "data_offset"}) {
    CheckpointState state = SampleState();
    if (std::string(field) == "step") state.step = -5;
    if (std::string(field) == "data_epoch") state.data_epoch = -1;
    if (std::string(field) == "data_offset") state.data_offset = -7;
    const std::string message = ErrorLoading(SerializeCheckpoint(state));
    EXPECT_NE(message.find(std::string("checkpoint 'mem': metadata: ") + field + " is -"),
              std::string::npos)
        << message;
  }
}

// An endless file (/dev/zero) is refused at its first bytes, not read until
// memory runs out.
TEST_F(CheckpointTest, AnEndlessFileIsRefusedAtItsHeader) {
  try {
    LoadCheckpoint("/dev/zero");
    FAIL() << "/dev/zero loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/dev/zero': not a stillpoint checkpoint"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CheckpointTest, MissingFileNamesThePath) {
  try {
    LoadCheckpoint((dir_ / "none.ckpt").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none.ckpt"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stillpoint::checkpoint_test
