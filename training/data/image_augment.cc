#include "training/data/image_augment.h"

#include <vector>

namespace stillpoint {

int64_t PatchedPixelIndex(const ImageAugmentOptions& options, int64_t row, int64_t col) {
  const int64_t p = options.patch, patches_per_row = options.side / p;
  const int64_t token = (row / p) * patches_per_row + col / p;
  return token * p * p + (row % p) * p + col % p;
}

void AugmentPatchedImages(const ImageAugmentOptions& options, Rng& rng, Batch* batch) {
  const int64_t side = options.side;
  SP_CHECK(options.patch >= 1 && side % options.patch == 0, "AugmentPatchedImages: patch ",
           options.patch, " does not divide the image side ", side);
  SP_CHECK(options.shift >= 0 && options.shift < side, "AugmentPatchedImages: shift ",
           options.shift, " outside [0, ", side, ")");
  const int64_t pixels = side * side;
  SP_CHECK(batch->features.defined() && batch->features.numel() == batch->batch_size * pixels,
           "AugmentPatchedImages: the batch's features are not ", batch->batch_size,
           " images of ", side, "x", side, " pixels");
  // The layout's index of every pixel, row-major.
  std::vector<int64_t> index(pixels);
  for (int64_t r = 0; r < side; ++r) {
    for (int64_t c = 0; c < side; ++c) index[r * side + c] = PatchedPixelIndex(options, r, c);
  }
  DispatchDType(batch->features.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* features = batch->features.data<T>();
    std::vector<T> image(pixels);
    for (int64_t b = 0; b < batch->batch_size; ++b) {
      const bool flip = options.flip && rng.UniformInt(2) == 1;
      const int64_t shift = options.shift;
      const int64_t dr = shift > 0 ? rng.UniformInt(2 * shift + 1) - shift : 0;
      const int64_t dc = shift > 0 ? rng.UniformInt(2 * shift + 1) - shift : 0;
      if (!flip && dr == 0 && dc == 0) continue;
      T* example = features + b * pixels;
      for (int64_t k = 0; k < pixels; ++k) image[k] = example[index[k]];
      for (int64_t r = 0; r < side; ++r) {
        for (int64_t c = 0; c < side; ++c) {
          // Output (r, c) shows pixel (r - dr, c - dc) of the image, mirrored
          // first when flip.
          const int64_t sr = r - dr, shifted_col = c - dc;
          const int64_t sc = flip ? side - 1 - shifted_col : shifted_col;
          const bool inside = sr >= 0 && sr < side && sc >= 0 && sc < side;
          example[index[r * side + c]] = inside ? image[sr * side + sc] : T(0);
        }
      }
    }
  });
}

}  // namespace stillpoint
