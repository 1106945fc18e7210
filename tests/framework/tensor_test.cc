#include "framework/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "framework/buffer_pool.h"
#include "framework/kernels/buffer.h"
#include "framework/random.h"

namespace stillpoint::tensor_test {
namespace {

TEST(ShapeTest, ExtentsNumelAndNegativeAxes) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.ToString(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_THROW(s.dim(3), Error);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5}), Error);
}

// Item 12 of issue 48: [2^31, 2^31] and [2^62, 4] overflowed the element
// or byte count and were accepted. Every shape's size is now checked; the
// largest allowed one holds exactly kMaxElements.
TEST(ShapeTest, ASizeThatOverflowsIsRefused) {
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{int64_t{1} << 62, 4},
                                         {int64_t{1} << 31, int64_t{1} << 31},
                                         {int64_t{1} << 40, int64_t{1} << 40, 0},
                                         {int64_t{1} << 30, int64_t{1} << 30, 2}}) {
    try {
      Shape shape(dims);
      FAIL() << "accepted " << shape.ToString();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("more than 1152921504606846976 (2^60) elements"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_EQ((Shape{int64_t{1} << 30, int64_t{1} << 30}).numel(), Shape::kMaxElements);
  EXPECT_EQ((Shape{0, int64_t{1} << 40}).numel(), 0);
}

TEST(TensorTest, FactoriesAndElementAccessInBothDtypes) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Tensor t = Tensor::FromVector(Shape{2, 2}, {1, 2, 3, 4.5}, dtype);
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_DOUBLE_EQ(t.at(3), 4.5);
    EXPECT_DOUBLE_EQ(Tensor::Full(Shape{3}, 2.5, dtype).at(2), 2.5);
    EXPECT_DOUBLE_EQ(Tensor::Zeros(Shape{5}, dtype).at(4), 0.0);
    EXPECT_DOUBLE_EQ(Tensor::Scalar(7, dtype).item(), 7.0);
  }
  EXPECT_THROW(Tensor::FromVector(Shape{3}, {1, 2}, DType::kFloat32), Error);
}

TEST(TensorTest, TypedAccessChecksTheDtype) {
  Tensor t = Tensor::Zeros(Shape{2}, DType::kFloat32);
  EXPECT_NO_THROW(t.data<float>());
  try {
    t.data<double>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos);
  }
}

TEST(TensorTest, ReshapeAndSliceRowsAreViewsSharingStorage) {
  Tensor t = Tensor::FromVector(Shape{3, 2}, {0, 1, 2, 3, 4, 5}, DType::kFloat64);
  Tensor flat = t.Reshape(Shape{6});
  flat.set(5, 50.0);
  EXPECT_DOUBLE_EQ(t.at(5), 50.0);
  Tensor rows = t.SliceRows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 2}));
  EXPECT_DOUBLE_EQ(rows.at(0), 2.0);
  rows.set(0, -2.0);
  EXPECT_DOUBLE_EQ(t.at(2), -2.0);
  EXPECT_THROW(t.Reshape(Shape{4}), Error);
  EXPECT_THROW(t.SliceRows(2, 4), Error);
}

TEST(TensorTest, HoldsStorageAloneUntilAViewSharesIt) {
  EXPECT_FALSE(Tensor().HoldsStorageAlone());
  Tensor t = Tensor::Zeros(Shape{3, 2}, DType::kFloat32);
  EXPECT_TRUE(t.HoldsStorageAlone());
  {
    const Tensor rows = t.SliceRows(1, 2);
    EXPECT_FALSE(t.HoldsStorageAlone());
    EXPECT_FALSE(rows.HoldsStorageAlone());
  }
  EXPECT_TRUE(t.HoldsStorageAlone());
  const Tensor copy = t;  // shares, like a view
  EXPECT_FALSE(t.HoldsStorageAlone());
  EXPECT_TRUE(t.Clone().HoldsStorageAlone());
}

TEST(TensorTest, CloneIsDeepAndToConvertsDtype) {
  Tensor t = Tensor::FromVector(Shape{2}, {1.25, -3.5}, DType::kFloat64);
  Tensor c = t.Clone();
  c.set(0, 9.0);
  EXPECT_DOUBLE_EQ(t.at(0), 1.25);
  Tensor f = t.To(DType::kFloat32);
  EXPECT_EQ(f.dtype(), DType::kFloat32);
  EXPECT_DOUBLE_EQ(f.at(1), -3.5);
}

TEST(TensorTest, HasNonFiniteDetectsNanAndInf) {
  Tensor t = Tensor::Zeros(Shape{4}, DType::kFloat32);
  EXPECT_FALSE(HasNonFinite(t));
  t.set(2, std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(HasNonFinite(t));
  t.set(2, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(HasNonFinite(t));
}

TEST(TensorTest, DtypeNamesRoundTrip) {
  DType d;
  ASSERT_TRUE(StringToDType(ToString(DType::kFloat64), &d));
  EXPECT_EQ(d, DType::kFloat64);
  ASSERT_TRUE(StringToDType("float32", &d));
  EXPECT_EQ(d, DType::kFloat32);
  EXPECT_FALSE(StringToDType("int8", &d));
}

TEST(TensorTest, BitwiseEqualComparesBytesShapeAndDtype) {
  const Tensor a = Tensor::FromVector(Shape{2, 2}, {1.0, -2.0, 0.0, 3.5}, DType::kFloat32);
  EXPECT_TRUE(BitwiseEqual(a, a.Clone()));
  EXPECT_FALSE(BitwiseEqual(a, a.Reshape(Shape{4})));
  EXPECT_FALSE(BitwiseEqual(a, a.To(DType::kFloat64)));
  Tensor b = a.Clone();
  b.set(2, -0.0);  // equal as a number, not as bytes
  EXPECT_FALSE(BitwiseEqual(a, b));
  b.set(2, 0.0);
  b.set(3, std::nextafter(3.5, 4.0));  // rounds back to 3.5 in float32
  EXPECT_TRUE(BitwiseEqual(a, b));
  b.set(3, std::nextafter(3.5f, 4.0f));  // one float32 ulp apart
  EXPECT_FALSE(BitwiseEqual(a, b));
  // Views compare their own elements: the second row of a against a copy.
  EXPECT_TRUE(BitwiseEqual(a.SliceRows(1, 2), a.SliceRows(1, 2).Clone()));
  EXPECT_FALSE(BitwiseEqual(a.SliceRows(0, 1), a.SliceRows(1, 2)));
  EXPECT_TRUE(BitwiseEqual(Tensor(), Tensor()));
  EXPECT_FALSE(BitwiseEqual(a, Tensor()));
}

TEST(BufferPoolTest, FreedBuffersAreReusedInsteadOfReallocated) {
  ResetBufferPoolStats();
  { Tensor warm(Shape{1000}, DType::kFloat32); }
  const BufferPoolStats before = GetBufferPoolStats();
  for (int i = 0; i < 100; ++i) {
    Tensor t(Shape{1000}, DType::kFloat32);
    t.Fill(i);
  }
  const BufferPoolStats after = GetBufferPoolStats();
  EXPECT_EQ(after.system_allocations, before.system_allocations);
  EXPECT_GE(after.reuses - before.reuses, 100);
}

// Runs `work` on a new thread whose buffer-pool slot differs from the
// calling thread's (slots are handed out in turn, so one of two threads in a
// row has another slot).
template <typename Work>
void RunOnThreadWithOtherSlot(Work work) {
  const int own_slot = BufferPoolThreadSlot();
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool ran = false;
    std::thread helper([&] {
      if (BufferPoolThreadSlot() == own_slot) return;
      work();
      ran = true;
    });
    helper.join();
    if (ran) return;
  }
  FAIL() << "no thread with a buffer-pool slot other than " << own_slot;
}

TEST(BufferPoolTest, AThreadGetsBackItsOwnFreedBufferBeforeAnotherThreads) {
  ReleaseCachedBuffers();
  constexpr std::size_t kBytes = 5000;
  auto mine = std::make_unique<Buffer>(kBytes);
  auto theirs = std::make_unique<Buffer>(kBytes);
  void* const mine_data = mine->data();
  void* const theirs_data = theirs->data();
  mine.reset();  // cached in this thread's slot
  // Freed last, on another thread: a single shared cache would hand it out next.
  RunOnThreadWithOtherSlot([&] { theirs.reset(); });
  ASSERT_EQ(theirs, nullptr);
  const BufferPoolStats before = GetBufferPoolStats();
  Buffer again(kBytes);
  EXPECT_EQ(again.data(), mine_data);
  EXPECT_NE(again.data(), theirs_data);
  EXPECT_EQ(GetBufferPoolStats().system_allocations, before.system_allocations);
}

TEST(BufferPoolTest, AThreadTakesAnotherThreadsFreedBufferBeforeAllocating) {
  ReleaseCachedBuffers();
  constexpr std::size_t kBytes = 5000;
  void* freed_data = nullptr;
  RunOnThreadWithOtherSlot([&] {
    Buffer buffer(kBytes);
    freed_data = buffer.data();
  });
  ASSERT_NE(freed_data, nullptr);
  const BufferPoolStats before = GetBufferPoolStats();
  Buffer reused(kBytes);
  EXPECT_EQ(reused.data(), freed_data);
  EXPECT_EQ(GetBufferPoolStats().system_allocations, before.system_allocations);
}

TEST(BufferPoolTest, BuffersAreSixtyFourByteAligned) {
  Tensor t(Shape{3}, DType::kFloat64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<double>()) % 64, 0u);
}

TEST(TensorExternalTest, SharesTheOwnersMemoryBothWaysAndKeepsTheOwnerAlive) {
  auto owner = std::make_shared<std::vector<double>>(std::vector<double>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<double>> watch = owner;
  const BufferPoolStats before = GetBufferPoolStats();
  Tensor t = Tensor::FromExternal(owner->data(), Shape{2, 3}, DType::kFloat64, owner);
  EXPECT_EQ(t.data<double>(), owner->data());
  // Nothing comes from the pool.
  EXPECT_EQ(GetBufferPoolStats().bytes_in_use, before.bytes_in_use);
  // Written by the owner, read through the tensor, and the reverse.
  (*owner)[4] = 50;
  EXPECT_EQ(t.at(4), 50);
  t.set(1, -2);
  EXPECT_EQ((*owner)[1], -2);
  // The owner shares the storage: it is never handed over.
  EXPECT_FALSE(t.HoldsStorageAlone());
  Tensor row = t.SliceRows(1, 2).Reshape(Shape{3});
  Tensor copy = t.Clone();
  copy.set(0, 99);
  EXPECT_EQ((*owner)[0], 1);  // a clone is a copy
  owner.reset();
  t = Tensor();
  ASSERT_FALSE(watch.expired());  // the view still holds the owner
  EXPECT_EQ(row.at(1), 50);
  row = Tensor();
  EXPECT_TRUE(watch.expired());  // released with the last view
}

TEST(TensorExternalTest, FloatStorageAndAnEmptyShape) {
  std::vector<float> values = {0.5f, 1.5f};
  Tensor t = Tensor::FromExternal(values.data(), Shape{2}, DType::kFloat32, nullptr);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.at(1), 1.5);
  EXPECT_EQ(Tensor::FromExternal(nullptr, Shape{0, 3}, DType::kFloat32, nullptr).numel(), 0);
  EXPECT_THROW(Tensor::FromExternal(nullptr, Shape{2}, DType::kFloat32, nullptr), Error);
}

TEST(RngTest, SeedsReproduceAndStateRoundTrips) {
  Rng a(42), b(42), c(43);
  EXPECT_EQ(a.NextU64(), b.NextU64());
  EXPECT_NE(a.NextU64(), c.NextU64());
  const std::string state = a.SaveState();
  const double next = a.Normal();
  Rng restored;
  ASSERT_TRUE(restored.LoadState(state));
  EXPECT_EQ(restored.Normal(), next);
  EXPECT_FALSE(restored.LoadState("not a state"));
}

TEST(RngTest, NormalHasUnitMomentsAndUniformIsInRange) {
  Rng rng(5);
  Tensor t = RandomNormal(Shape{20000}, 0, 1, DType::kFloat64, rng);
  double mean = 0, sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    mean += t.at(i);
    sq += t.at(i) * t.at(i);
  }
  mean /= t.numel();
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(sq / t.numel(), 1.0, 0.05);
  Tensor u = RandomUniform(Shape{1000}, -2, 3, DType::kFloat32, rng);
  for (int64_t i = 0; i < u.numel(); ++i) {
    ASSERT_GE(u.at(i), -2.0);
    ASSERT_LT(u.at(i), 3.0);
  }
}

}  // namespace
}  // namespace stillpoint::tensor_test
