#include "training/data/image_augment.h"

#include <gtest/gtest.h>

#include <vector>

#include "training/data/dataset.h"

namespace stillpoint::image_augment_test {
namespace {

// One 8x8 image of patches of 4 (4 tokens of 16 pixels) whose pixel (r, c)
// holds 1 + 8 r + c, so every pixel can be traced.
Batch OneImage(int64_t copies = 1) {
  const ImageAugmentOptions layout{8, 4, false, 0};
  Batch batch;
  batch.batch_size = copies;
  batch.length = 4;
  batch.features = Tensor(Shape{copies, 4, 16}, DType::kFloat64);
  for (int64_t b = 0; b < copies; ++b) {
    for (int64_t r = 0; r < 8; ++r) {
      for (int64_t c = 0; c < 8; ++c) {
        batch.features.set(b * 64 + PatchedPixelIndex(layout, r, c), 1.0 + 8 * r + c);
      }
    }
  }
  return batch;
}

double Pixel(const Batch& batch, int64_t b, int64_t r, int64_t c) {
  return batch.features.at(b * 64 + PatchedPixelIndex({8, 4, false, 0}, r, c));
}

// Whether image b of an OneImage batch is the original mirrored left-right
// (when flip), then moved by (dr, dc) with 0 on the uncovered pixels: every
// pixel checked.
bool ShowsTransform(const Batch& batch, int64_t b, bool flip, int64_t dr, int64_t dc) {
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t c = 0; c < 8; ++c) {
      const int64_t sr = r - dr, shifted_col = c - dc;
      const int64_t sc = flip ? 7 - shifted_col : shifted_col;
      const bool inside = sr >= 0 && sr < 8 && sc >= 0 && sc < 8;
      if (Pixel(batch, b, r, c) != (inside ? 1.0 + 8 * sr + sc : 0.0)) return false;
    }
  }
  return true;
}

TEST(ImageAugmentTest, PatchedPixelIndexFollowsThePatchTokenLayout) {
  const ImageAugmentOptions layout{8, 4, false, 0};
  EXPECT_EQ(PatchedPixelIndex(layout, 0, 0), 0);
  EXPECT_EQ(PatchedPixelIndex(layout, 0, 3), 3);
  EXPECT_EQ(PatchedPixelIndex(layout, 1, 0), 4);      // second row of the first patch
  EXPECT_EQ(PatchedPixelIndex(layout, 0, 4), 16);     // the second token
  EXPECT_EQ(PatchedPixelIndex(layout, 4, 0), 32);     // the third token (second patch row)
  EXPECT_EQ(PatchedPixelIndex(layout, 7, 7), 63);
}

// Over many draws each image is either itself or its mirror image, and both
// occur.
TEST(ImageAugmentTest, FlipMirrorsTheColumnsOrLeavesTheImage) {
  Batch batch = OneImage(200);
  Rng rng(3);
  AugmentPatchedImages({8, 4, true, 0}, rng, &batch);
  int mirrored = 0;
  for (int64_t b = 0; b < 200; ++b) {
    const bool flipped = Pixel(batch, b, 0, 0) == 8.0;
    mirrored += flipped;
    ASSERT_TRUE(ShowsTransform(batch, b, flipped, 0, 0)) << "image " << b;
  }
  EXPECT_GT(mirrored, 70);
  EXPECT_LT(mirrored, 130);
}

// A shift moves every pixel by one (dr, dc) within [-2, 2] and fills the
// uncovered ones with 0; every offset occurs.
TEST(ImageAugmentTest, ShiftMovesThePixelsAndFillsWithZeros) {
  Batch batch = OneImage(400);
  Rng rng(5);
  AugmentPatchedImages({8, 4, false, 2}, rng, &batch);
  std::vector<int> seen(25, 0);
  for (int64_t b = 0; b < 400; ++b) {
    // The original pixel (3, 3) now sits at (3 + dr, 3 + dc).
    int64_t dr = -99, dc = -99;
    for (int64_t r = 1; r <= 5; ++r) {
      for (int64_t c = 1; c <= 5; ++c) {
        if (Pixel(batch, b, r, c) == 1.0 + 8 * 3 + 3) dr = r - 3, dc = c - 3;
      }
    }
    ASSERT_NE(dr, -99) << b;
    ++seen[(dr + 2) * 5 + dc + 2];
    ASSERT_TRUE(ShowsTransform(batch, b, false, dr, dc))
        << "image " << b << " shifted by (" << dr << ", " << dc << ")";
  }
  for (int count : seen) EXPECT_GT(count, 0);
}

// Flip and shift together: the mirror image, then shifted.
TEST(ImageAugmentTest, FlipThenShift) {
  Batch batch = OneImage(300);
  Rng rng(7);
  AugmentPatchedImages({8, 4, true, 1}, rng, &batch);
  int both = 0;
  for (int64_t b = 0; b < 300; ++b) {
    bool matched = false;
    for (int flip = 0; flip < 2 && !matched; ++flip) {
      for (int64_t dr = -1; dr <= 1 && !matched; ++dr) {
        for (int64_t dc = -1; dc <= 1 && !matched; ++dc) {
          matched = ShowsTransform(batch, b, flip == 1, dr, dc);
          both += matched && flip == 1 && (dr != 0 || dc != 0);
        }
      }
    }
    ASSERT_TRUE(matched) << "image " << b << " is no flip-and-shift of the original";
  }
  EXPECT_GT(both, 50);
}

// A batcher with an augment draws the same augmented batches after its
// position is restored, and other ones at other positions.
TEST(ImageAugmentTest, ABatcherAugmentsTheSameWayAfterARestore) {
  std::vector<Example> examples;
  for (int64_t i = 0; i < 10; ++i) {
    Example ex;
    for (int64_t k = 0; k < 64; ++k) ex.features.push_back(1.0 + k + 100 * i);
    ex.targets = {i % 3};
    examples.push_back(ex);
  }
  DatasetInfo info;
  info.length = 4;
  info.feature_dim = 16;
  info.num_classes = 3;
  info.per_token_targets = false;
  const InMemoryDataset data(info, examples);
  const BatchAugment augment = [](Rng& rng, Batch* batch) {
    AugmentPatchedImages({8, 4, true, 2}, rng, batch);
  };
  Batcher first(data, 4, 11, DType::kFloat64, augment);
  first.Next();
  const Batcher::Position position = first.position();
  const std::vector<double> second = first.Next().features.ToVector();
  const std::vector<double> third = first.Next().features.ToVector();
  Batcher resumed(data, 4, 11, DType::kFloat64, augment);
  resumed.Restore(position);
  EXPECT_EQ(resumed.Next().features.ToVector(), second);
  EXPECT_EQ(resumed.Next().features.ToVector(), third);
  // Without the augment the same examples come unchanged.
  Batcher plain(data, 4, 11, DType::kFloat64);
  plain.Restore(position);
  EXPECT_NE(plain.Next().features.ToVector(), second);
}

TEST(ImageAugmentTest, ABatchThatIsNotImagesOfTheSideIsAnError) {
  Batch batch = OneImage(2);
  Rng rng(1);
  EXPECT_THROW(AugmentPatchedImages({16, 4, true, 0}, rng, &batch), Error);
  EXPECT_THROW(AugmentPatchedImages({8, 3, true, 0}, rng, &batch), Error);
}

}  // namespace
}  // namespace stillpoint::image_augment_test
