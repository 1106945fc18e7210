// Incremental decoding (training/generate_step.h) against the full forward
// pass it replaces: the logits of each pushed position equal the last row of
// SequenceModel::Forward over the same symbols, for explicit, tied and
// implicit causal models (float64, the implicit solves to a tight
// tolerance); past the window, TextGenerator's restarted windows give the
// same text as the full-window path when keep = context - 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "framework/autograd.h"
#include "framework/random.h"
#include "layers/models.h"
#include "training/generate.h"
#include "training/generate_step.h"

namespace stillpoint::generate_step_test {
namespace {

constexpr int64_t kVocab = 9;
constexpr int64_t kContext = 8;

ModelOptions CausalOptions(ModelKind kind) {
  ModelOptions options;
  options.kind = kind;
  options.vocab_size = kVocab;
  options.dim = 16;
  options.cell_options.heads = 2;
  options.cell_options.hidden = 24;
  options.max_length = kContext;
  options.num_layers = 3;
  options.unroll_steps = 3;
  options.attention_mask = AttentionMaskKind::kCausal;
  options.dtype = DType::kFloat64;
  options.embedding_init_std = 0.5;
  options.seed = 11;
  // Tight solves, so the joint and the one-position-at-a-time fixed points
  // agree far below any difference a bug would make.
  options.implicit.forward.max_iterations = 300;
  options.implicit.forward.relative_tolerance = 1e-13;
  options.implicit.forward.absolute_tolerance = 1e-13;
  return options;
}

std::vector<int64_t> RandomIds(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    ids.push_back(1 + static_cast<int64_t>(rng.Uniform() * (kVocab - 1)) % (kVocab - 1));
  }
  return ids;
}

// The last row of a full forward pass over `window`.
std::vector<double> LastRowOfForward(SequenceModel& model, const std::vector<int64_t>& window) {
  NoGrad no_grad;
  const std::vector<double> all =
      model.Forward(window, Shape{1, static_cast<int64_t>(window.size())}).value().ToVector();
  return std::vector<double>(all.end() - kVocab, all.end());
}

double MaxAbsDifference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

// Pushes ids one by one and compares every position's logits with a full
// forward pass over the prefix; returns the largest difference.
double CompareWithForward(SequenceModel& model, StepDecoder& decoder,
                          const std::vector<int64_t>& ids) {
  double worst = 0;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const std::vector<double> step = decoder.Push(ids[t]);
    const std::vector<double> full =
        LastRowOfForward(model, std::vector<int64_t>(ids.begin(), ids.begin() + t + 1));
    worst = std::max(worst, MaxAbsDifference(step, full));
  }
  return worst;
}

class StepDecoderTest : public testing::TestWithParam<ModelKind> {};

TEST_P(StepDecoderTest, EveryPositionMatchesTheFullForwardPass) {
  SequenceModel model(CausalOptions(GetParam()));
  model.Eval();
  ASSERT_TRUE(StepDecoder::Supports(model));
  StepDecoder decoder(model, /*warm_start=*/true);
  const std::vector<int64_t> ids = RandomIds(kContext, 3);
  // Logits are O(1): a missing key, a wrong position or a stale cache moves
  // them by far more than this.
  EXPECT_LT(CompareWithForward(model, decoder, ids), 1e-9);
  EXPECT_EQ(decoder.length(), kContext);
  EXPECT_EQ(decoder.symbols(), ids);
  // A slid window: the last 3 symbols again at positions 0..2, then more;
  // each equals a forward pass over the new window alone.
  const std::vector<int64_t> kept(ids.end() - 3, ids.end());
  EXPECT_LT(MaxAbsDifference(decoder.Slide(3), LastRowOfForward(model, kept)), 1e-9);
  EXPECT_EQ(decoder.symbols(), kept);
  std::vector<int64_t> window = kept;
  for (int64_t id : RandomIds(4, 4)) {
    window.push_back(id);
    EXPECT_LT(MaxAbsDifference(decoder.Push(id), LastRowOfForward(model, window)), 1e-9);
  }
  // A chunk of several symbols (a prompt) at once, after Reset.
  decoder.Reset();
  const std::vector<int64_t> chunk(ids.begin(), ids.begin() + 5);
  EXPECT_LT(MaxAbsDifference(decoder.Push(chunk), LastRowOfForward(model, chunk)), 1e-9);
  EXPECT_LT(MaxAbsDifference(decoder.Push(std::vector<int64_t>(ids.begin() + 5, ids.end())),
                             LastRowOfForward(model, ids)),
            1e-9);
}

INSTANTIATE_TEST_SUITE_P(Kinds, StepDecoderTest,
                         testing::Values(ModelKind::kExplicit, ModelKind::kTied,
                                         ModelKind::kImplicit),
                         [](const testing::TestParamInfo<ModelKind>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(StepDecoderInjectionTest, FirstStepInjectionMatchesTheFullForwardPass) {
  ModelOptions options = CausalOptions(ModelKind::kExplicit);
  options.input_injection = InputInjection::kFirstStep;
  SequenceModel model(options);
  model.Eval();
  StepDecoder decoder(model, true);
  EXPECT_LT(CompareWithForward(model, decoder, RandomIds(kContext, 5)), 1e-9);
}

// The start of a new position's solve (the previous position's fixed point,
// or zero) changes the iterations, not the fixed point. Neither start is
// always cheaper (the previous position belongs to another symbol): the
// iterations are counted, not compared.
TEST(StepDecoderImplicitTest, WarmAndColdStartsReachTheSameFixedPoints) {
  ModelOptions options = CausalOptions(ModelKind::kImplicit);
  options.implicit.forward.relative_tolerance = 1e-8;
  options.implicit.forward.absolute_tolerance = 1e-8;
  SequenceModel model(options);
  model.Eval();
  const std::vector<int64_t> ids = RandomIds(kContext, 6);
  StepDecoder warm(model, true), cold(model, false);
  int64_t warm_iterations = 0, cold_iterations = 0;
  for (int64_t id : ids) {
    const std::vector<double> a = warm.Push(id), b = cold.Push(id);
    EXPECT_LT(MaxAbsDifference(a, b), 1e-6);
    EXPECT_TRUE(warm.last_converged() && cold.last_converged());
    EXPECT_GT(warm.last_iterations(), 0);
    warm_iterations += warm.last_iterations();
    cold_iterations += cold.last_iterations();
  }
  EXPECT_NE(warm_iterations, cold_iterations);  // the starts differ
}

TEST(StepDecoderSupportTest, NamesWhatItCannotDecode) {
  std::string why;
  ModelOptions energy = CausalOptions(ModelKind::kEnergy);
  EXPECT_FALSE(StepDecoder::Supports(SequenceModel(energy), &why));
  EXPECT_NE(why.find("energy model"), std::string::npos) << why;
  ModelOptions rotary = CausalOptions(ModelKind::kExplicit);
  rotary.positions = PositionScheme::kRotary;
  EXPECT_FALSE(StepDecoder::Supports(SequenceModel(rotary), &why));
  EXPECT_NE(why.find("rotary"), std::string::npos) << why;
  ModelOptions open = CausalOptions(ModelKind::kExplicit);
  open.attention_mask = AttentionMaskKind::kNone;
  EXPECT_FALSE(StepDecoder::Supports(SequenceModel(open), &why));
  EXPECT_NE(why.find("not causal"), std::string::npos) << why;
  EXPECT_THROW(StepDecoder(SequenceModel(open), true), Error);
  SequenceModel model(CausalOptions(ModelKind::kExplicit));
  StepDecoder decoder(model, true);
  decoder.Push(std::vector<int64_t>{1, 2});
  EXPECT_THROW(decoder.Slide(3), Error);  // keeps more than the window holds
  EXPECT_THROW(decoder.Push(std::vector<int64_t>{}), Error);
}

Vocabulary LetterVocabulary() {
  std::vector<uint32_t> symbols;
  for (uint32_t c = 'a'; c < 'a' + kVocab - 1; ++c) symbols.push_back(c);
  return Vocabulary::Build(symbols, TextEncoding::kUtf8);
}

// Past the window: keep = context - 1 restarts a window of the last
// context - 1 symbols before each new one, which is the full-window path's
// window; greedy sampling then gives the same text, and the work counts say
// what each path computed.
class SlidingTest : public testing::TestWithParam<ModelKind> {};

TEST_P(SlidingTest, KeepingContextMinusOneIsTheFullWindowPath) {
  auto model = std::make_shared<SequenceModel>(CausalOptions(GetParam()));
  TextGenerator generator(model, LetterVocabulary(), kContext);
  GenerateOptions options;
  options.tokens = 20;
  options.top_k = 1;
  options.keep = kContext - 1;
  const GenerateResult incremental = generator.Generate("abc", options);
  options.incremental = false;
  const GenerateResult full = generator.Generate("abc", options);
  EXPECT_EQ(incremental.mode, "incremental");
  EXPECT_EQ(full.mode, "full_window");
  ASSERT_EQ(incremental.text.size(), 20u);
  EXPECT_EQ(incremental.text, full.text);
  // 3 prompt symbols, then 19 pushes; windows of 8 restart from 7 symbols
  // for each of the 19 - 5 pushes after the window filled.
  EXPECT_EQ(incremental.restarts, 19 - 5);
  EXPECT_EQ(incremental.positions, 3 + 19 + 14 * 7);
  // The full path's windows: 3, 4, ..., 8, then 8 for every later symbol.
  EXPECT_EQ(full.positions, (3 + 4 + 5 + 6 + 7) + 15 * 8);
  if (GetParam() == ModelKind::kImplicit) {
    ASSERT_EQ(incremental.iterations.size(), 20u);
    EXPECT_GT(incremental.IterationsMean(), 0.0);
  }
  // The default keeps half the window: fewer positions, a restart every
  // context / 2 symbols.
  options.incremental = true;
  options.keep = 0;
  const GenerateResult half = generator.Generate("abc", options);
  EXPECT_EQ(half.text.size(), 20u);
  EXPECT_LT(half.positions, incremental.positions);
  EXPECT_EQ(half.restarts, 4);  // at pushes 6, 10, 14 and 18 of 19
}

INSTANTIATE_TEST_SUITE_P(Kinds, SlidingTest,
                         testing::Values(ModelKind::kExplicit, ModelKind::kImplicit),
                         [](const testing::TestParamInfo<ModelKind>& info) {
                           return std::string(ToString(info.param));
                         });

TEST(GenerateFallbackTest, ModelsWithoutAStepReadTheWholeWindowAndSayWhy) {
  ModelOptions options = CausalOptions(ModelKind::kExplicit);
  options.positions = PositionScheme::kRotary;
  TextGenerator generator(std::make_shared<SequenceModel>(options), LetterVocabulary(), kContext);
  GenerateOptions generate;
  generate.tokens = 3;
  const GenerateResult result = generator.Generate("ab", generate);
  EXPECT_EQ(result.mode, "full_window");
  EXPECT_NE(result.full_window_reason.find("rotary"), std::string::npos);
  generate.keep = kContext;
  EXPECT_THROW(generator.Generate("ab", generate), Error);
}

}  // namespace
}  // namespace stillpoint::generate_step_test
