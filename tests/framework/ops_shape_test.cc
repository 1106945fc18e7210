// Shape and index ops: values, views, first and second order gradients,
// float32, and errors that name the op and the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "framework/gradcheck.h"
#include "framework/ops.h"
#include "framework/parallel.h"
#include "framework/random.h"

namespace stillpoint::ops_shape_test {
namespace {

Var Random(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64) {
  Rng rng(seed);
  return Var(RandomNormal(shape, 0.0, 1.0, dtype, rng));
}

// 0, 1, 2, ... in the given shape.
Var Iota(const Shape& shape, DType dtype = DType::kFloat64) {
  return Var(Tensor::Arange(shape.numel(), dtype).Reshape(shape));
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void ExpectErrorMentions(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  const std::string message = ErrorOf(fn);
  ASSERT_FALSE(message.empty()) << "no stillpoint::Error was thrown";
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

// ------------------------------------------------------------------ reshape

TEST(ReshapeTest, SharesStorageAndKeepsOrder) {
  Var x = Iota(Shape{2, 3, 4});
  Var y = reshape(x, Shape{6, 4});
  EXPECT_EQ(y.shape(), (Shape{6, 4}));
  EXPECT_TRUE(y.value().SameStorage(x.value()));
  EXPECT_EQ(y.value().at(13), 13.0);
}

TEST(ReshapeTest, Gradients) {
  auto f = [](const VarList& in) { return square(reshape(in[0], Shape{4, 3})); };
  auto r = CheckGradients(f, {Random(Shape{2, 6}, 1)});
  EXPECT_TRUE(r) << r;
  auto r2 = CheckSecondOrderGradients(f, {Random(Shape{2, 6}, 2)});
  EXPECT_TRUE(r2) << r2;
}

TEST(ReshapeTest, WrongNumelNamesShapes) {
  ExpectErrorMentions(
      [] {
        reshape(Iota(Shape{2, 3}), Shape{4, 2});
      },
      {"reshape", "[2, 3]", "[4, 2]"});
}

// ------------------------------------------------------- transpose, permute

TEST(TransposeTest, SwapsAxes) {
  Var x = Iota(Shape{2, 3, 4});
  Var y = transpose(x, 0, -1);
  ASSERT_EQ(y.shape(), (Shape{4, 3, 2}));
  // y[k, j, i] = x[i, j, k]
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t k = 0; k < 4; ++k) {
        EXPECT_EQ(y.value().at(k * 6 + j * 2 + i), x.value().at(i * 12 + j * 4 + k));
      }
    }
  }
}

TEST(TransposeTest, Gradients) {
  auto r = CheckGradients([](const VarList& in) { return transpose(in[0], 1, 2); },
                          {Random(Shape{2, 3, 4}, 3)});
  EXPECT_TRUE(r) << r;
}

TEST(PermuteTest, FourDimensionalValues) {
  Var x = Iota(Shape{2, 3, 4, 5});
  Var y = permute(x, {2, 0, 3, 1});
  ASSERT_EQ(y.shape(), (Shape{4, 2, 5, 3}));
  // y[c, a, d, b] = x[a, b, c, d]
  for (int64_t a = 0; a < 2; ++a) {
    for (int64_t b = 0; b < 3; ++b) {
      for (int64_t c = 0; c < 4; ++c) {
        for (int64_t d = 0; d < 5; ++d) {
          const int64_t yi = ((c * 2 + a) * 5 + d) * 3 + b;
          const int64_t xi = ((a * 3 + b) * 4 + c) * 5 + d;
          ASSERT_EQ(y.value().at(yi), x.value().at(xi));
        }
      }
    }
  }
}

TEST(PermuteTest, Gradients) {
  auto f = [](const VarList& in) { return permute(in[0], {1, 3, 0, 2}); };
  auto r = CheckGradients(f, {Random(Shape{2, 3, 2, 4}, 4)});
  EXPECT_TRUE(r) << r;
  auto f2 = [](const VarList& in) { return square(permute(in[0], {2, 0, 1})); };
  auto r2 = CheckSecondOrderGradients(f2, {Random(Shape{2, 3, 4}, 5)});
  EXPECT_TRUE(r2) << r2;
}

TEST(PermuteTest, RejectsNonPermutation) {
  ExpectErrorMentions(
      [] {
        permute(Iota(Shape{2, 3, 4}), {0, 0, 1});
      },
      {"permute", "[0, 0, 1]", "[2, 3, 4]"});
  ExpectErrorMentions([] { permute(Iota(Shape{2, 3}), {1, 0, 2}); }, {"permute", "[2, 3]"});
  ExpectErrorMentions([] { transpose(Iota(Shape{2, 3}), 0, 2); }, {"transpose", "[2, 3]"});
}

// -------------------------------------------------------------- slice, concat

TEST(SliceTest, PicksRangeAlongMiddleAxis) {
  Var x = Iota(Shape{2, 5, 3});
  Var y = slice(x, 1, 1, 4);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t k = 0; k < 3; ++k) {
        EXPECT_EQ(y.value().at((i * 3 + j) * 3 + k), x.value().at((i * 5 + j + 1) * 3 + k));
      }
    }
  }
}

TEST(SliceTest, Gradients) {
  auto f = [](const VarList& in) { return slice(in[0], -1, 1, 3); };
  auto r = CheckGradients(f, {Random(Shape{3, 2, 4}, 6)});
  EXPECT_TRUE(r) << r;
  auto f2 = [](const VarList& in) { return square(slice(in[0], 0, 1, 3)); };
  auto r2 = CheckSecondOrderGradients(f2, {Random(Shape{4, 3}, 7)});
  EXPECT_TRUE(r2) << r2;
}

TEST(SliceTest, OutOfRangeNamesShape) {
  ExpectErrorMentions([] { slice(Iota(Shape{2, 5}), 1, 3, 7); }, {"slice", "[2, 5]", "7"});
  ExpectErrorMentions([] { slice(Iota(Shape{2, 5}), 1, 4, 2); }, {"slice", "[2, 5]"});
}

TEST(ConcatTest, JoinsAlongAxis) {
  Var a = Iota(Shape{2, 1, 3});
  Var b = Var(Tensor::Full(Shape{2, 2, 3}, -1.0, DType::kFloat64));
  Var c = concat({a, b}, 1);
  ASSERT_EQ(c.shape(), (Shape{2, 3, 3}));
  EXPECT_EQ(c.value().at(0 * 9 + 0 * 3 + 2), 2.0);
  EXPECT_EQ(c.value().at(0 * 9 + 1 * 3 + 2), -1.0);
  EXPECT_EQ(c.value().at(1 * 9 + 0 * 3 + 1), 4.0);
  EXPECT_EQ(c.value().at(1 * 9 + 2 * 3 + 0), -1.0);
}

TEST(ConcatTest, Gradients) {
  auto f = [](const VarList& in) { return concat({in[0], in[1], in[2]}, -1); };
  auto r = CheckGradients(
      f, {Random(Shape{2, 3, 1}, 8), Random(Shape{2, 3, 2}, 9), Random(Shape{2, 3, 3}, 10)});
  EXPECT_TRUE(r) << r;
  auto f2 = [](const VarList& in) { return square(concat({in[0], in[1]}, 0)); };
  auto r2 = CheckSecondOrderGradients(f2, {Random(Shape{1, 3}, 11), Random(Shape{2, 3}, 12)});
  EXPECT_TRUE(r2) << r2;
}

TEST(ConcatTest, MismatchedShapesAndDTypes) {
  ExpectErrorMentions(
      [] {
        concat({Iota(Shape{2, 3}), Iota(Shape{3, 3})}, 1);
      },
      {"concat", "[2, 3]", "[3, 3]"});
  ExpectErrorMentions(
      [] {
        concat({Iota(Shape{2, 3}), Iota(Shape{2, 3}, DType::kFloat32)}, 0);
      },
      {"concat", "float32", "float64"});
}

// ------------------------------------------------------------------ gather

TEST(GatherTest, RepeatedIndicesPickAndAccumulate) {
  Var x(Iota(Shape{3, 4}).value(), true);
  Var y = gather(x, 1, {3, 0, 3});
  ASSERT_EQ(y.shape(), (Shape{3, 3}));
  EXPECT_EQ(y.value().at(0), 3.0);
  EXPECT_EQ(y.value().at(1), 0.0);
  EXPECT_EQ(y.value().at(5), 7.0);
  backward(sum(y));
  // Column 3 was picked twice, column 0 once, the others never.
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(x.grad().value().at(i * 4 + 0), 1.0);
    EXPECT_EQ(x.grad().value().at(i * 4 + 1), 0.0);
    EXPECT_EQ(x.grad().value().at(i * 4 + 3), 2.0);
  }
}

TEST(GatherTest, Gradients) {
  auto f = [](const VarList& in) { return gather(in[0], 0, {2, 0, 2, 1, 2}); };
  auto r = CheckGradients(f, {Random(Shape{3, 2, 2}, 13)});
  EXPECT_TRUE(r) << r;
  auto f2 = [](const VarList& in) { return square(gather(in[0], 1, {1, 1, 0})); };
  auto r2 = CheckSecondOrderGradients(f2, {Random(Shape{2, 3}, 14)});
  EXPECT_TRUE(r2) << r2;
}

TEST(GatherTest, OutOfRangeIndex) {
  ExpectErrorMentions([] { gather(Iota(Shape{3, 4}), 1, {0, 4}); }, {"gather", "4", "[3, 4]"});
  ExpectErrorMentions([] { gather(Iota(Shape{3, 4}), 0, {-1}); }, {"gather", "-1", "[3, 4]"});
}

// --------------------------------------------------------------- embedding

TEST(EmbeddingTest, LooksUpRowsInIdsShape) {
  Var table = Iota(Shape{5, 3});
  Var e = embedding(table, {4, 0, 4, 2}, Shape{2, 2});
  ASSERT_EQ(e.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(e.value().at(0), 12.0);
  EXPECT_EQ(e.value().at(3), 0.0);
  EXPECT_EQ(e.value().at(8), 14.0);
  EXPECT_EQ(e.value().at(9), 6.0);
}

TEST(EmbeddingTest, Gradients) {
  auto f = [](const VarList& in) { return embedding(in[0], {1, 3, 1, 0, 1, 2}, Shape{2, 3}); };
  auto r = CheckGradients(f, {Random(Shape{4, 3}, 15)});
  EXPECT_TRUE(r) << r;
  auto f2 = [](const VarList& in) { return square(embedding(in[0], {2, 2, 0}, Shape{3})); };
  auto r2 = CheckSecondOrderGradients(f2, {Random(Shape{3, 2}, 16)});
  EXPECT_TRUE(r2) << r2;
}

TEST(EmbeddingTest, BadIdsAndShapes) {
  ExpectErrorMentions(
      [] {
        embedding(Iota(Shape{5, 3}), {1, 5}, Shape{2});
      },
      {"embedding", "5", "[5, 3]"});
  ExpectErrorMentions(
      [] {
        embedding(Iota(Shape{5, 3}), {1, 2, 3}, Shape{2});
      },
      {"embedding", "[2]"});
  ExpectErrorMentions([] { embedding(Iota(Shape{15}), {1}, Shape{1}); }, {"embedding", "[15]"});
}

// ------------------------------------------------------------- masked_fill

TEST(MaskedFillTest, BroadcastMaskFillsAndBlocksGradient) {
  Var x(Iota(Shape{2, 3}).value(), true);
  // A [3] mask broadcast over rows: the middle column is masked.
  Tensor mask = Tensor::FromVector(Shape{3}, {0, 1, 0}, DType::kFloat32);
  Var y = masked_fill(x, mask, -7.0);
  EXPECT_EQ(y.value().ToVector(), (std::vector<double>{0, -7, 2, 3, -7, 5}));
  backward(sum(mul_scalar(y, 2.0)));
  EXPECT_EQ(x.grad().value().ToVector(), (std::vector<double>{2, 0, 2, 2, 0, 2}));
}

TEST(MaskedFillTest, Gradients) {
  Tensor mask = Tensor::FromVector(Shape{3, 1}, {1, 0, 1}, DType::kFloat64);
  auto f = [mask](const VarList& in) { return square(masked_fill(in[0], mask, 0.5)); };
  auto r = CheckGradients(f, {Random(Shape{2, 3, 4}, 17)});
  EXPECT_TRUE(r) << r;
  auto r2 = CheckSecondOrderGradients(f, {Random(Shape{2, 3, 4}, 18)});
  EXPECT_TRUE(r2) << r2;
}

TEST(MaskedFillTest, NegativeInfinityBeforeSoftmaxGivesExactZeros) {
  // A causal mask: entry (i, j) is masked when j > i.
  Tensor mask = Tensor::Zeros(Shape{4, 4}, DType::kFloat64);
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = i + 1; j < 4; ++j) mask.set(i * 4 + j, 1.0);
  }
  Var scores = Random(Shape{2, 4, 4}, 19);
  Var p = softmax(masked_fill(scores, mask, -std::numeric_limits<double>::infinity()));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 4; ++i) {
      double row = 0.0;
      for (int64_t j = 0; j < 4; ++j) {
        const double v = p.value().at((b * 4 + i) * 4 + j);
        if (j > i) {
          EXPECT_EQ(v, 0.0);
        }
        row += v;
      }
      EXPECT_NEAR(row, 1.0, 1e-12);
    }
  }
}

TEST(MaskedFillTest, MaskThatDoesNotBroadcast) {
  ExpectErrorMentions(
      [] {
        masked_fill(Iota(Shape{2, 3}), Tensor::Zeros(Shape{2}, DType::kFloat64), 0.0);
      },
      {"masked_fill", "[2]", "[2, 3]"});
}

// ------------------------------------------------------------------ float32

TEST(ShapeOpsTest, Float32ValuesMatchFloat64) {
  Var x64 = Random(Shape{3, 4, 2}, 20);
  Var x32(x64.value().To(DType::kFloat32));
  auto pipeline = [](const Var& x) {
    Var y = permute(x, {2, 0, 1});
    y = concat({slice(y, 2, 0, 2), gather(y, 2, {3, 3})}, 2);
    return reshape(y, Shape{2, 12});
  };
  Var y64 = pipeline(x64);
  Var y32 = pipeline(x32);
  EXPECT_EQ(y32.dtype(), DType::kFloat32);
  EXPECT_LT(MaxAbsDiff(y32.value().To(DType::kFloat64), y64.value()), 1e-6);
}

TEST(ShapeOpsTest, LargeCopiesAreIndependentOfThreadCount) {
  Var x = Random(Shape{16, 32, 64}, 21, DType::kFloat32);
  Tensor one, two;
  {
    ScopedNumThreads threads(1);
    one = permute(x, {2, 0, 1}).value();
  }
  {
    ScopedNumThreads threads(2);
    two = permute(x, {2, 0, 1}).value();
  }
  EXPECT_EQ(MaxAbsDiff(one, two), 0.0);
}

}  // namespace
}  // namespace stillpoint::ops_shape_test
