// Test helper: a DEQ transformer small enough for float64 comparisons of
// training steps (6 sequences of 5 tokens, width 8, 2 heads), with the
// bench's model options.
#pragma once

#include "layers/models.h"
#include "training/cli/bench_command.h"

namespace stillpoint {
namespace testing_support {

inline TransformerShapes TinyShapes() {
  TransformerShapes shapes;
  shapes.vocab_size = 7;
  shapes.batch = 6;
  shapes.length = 5;
  shapes.dim = 8;
  shapes.heads = 2;
  shapes.hidden = 12;
  shapes.num_layers = 2;
  return shapes;
}

inline ModelOptions TinyOptions(ModelKind kind, DType dtype) {
  return BenchModelOptions(TinyShapes(), kind, 6, dtype, 3);
}

}  // namespace testing_support
}  // namespace stillpoint
