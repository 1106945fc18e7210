// Random flips and shifts of images stored as patch tokens (task.flip and
// task.shift of fashion_mnist): each training example of a batch is mirrored
// left-right with probability 1/2 and moved by whole pixels, the uncovered
// pixels set to 0 (the images' background). Only training batches are
// augmented; the Batcher draws the random choices from its position, so a
// resumed run augments exactly as the uninterrupted one.
#pragma once

#include <cstdint>

#include "framework/random.h"
#include "training/data/dataset.h"

namespace stillpoint {

struct ImageAugmentOptions {
  int64_t side = 28;   // pixels per image side (square images)
  int64_t patch = 4;   // pixels per patch side; divides side
  bool flip = false;   // mirror left-right with probability 1/2
  int64_t shift = 0;   // move by -shift..shift pixels, rows and columns drawn apart
};

// The pixel at (row, col) of one image in the patch-token layout: its index
// in the example's features.
int64_t PatchedPixelIndex(const ImageAugmentOptions& options, int64_t row, int64_t col);

// Augments every example of batch (features [batch, tokens, patch^2]) with
// choices drawn from rng.
void AugmentPatchedImages(const ImageAugmentOptions& options, Rng& rng, Batch* batch);

}  // namespace stillpoint
