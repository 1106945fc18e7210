// The path-independence score against a hand computation, the comparison
// of the fixed points a model reaches from zeros and from a random start,
// random starts of training solves (model.solver.init), the progressive
// loss's unroll, and where the injection enters (model.input_injection).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "framework/ops.h"
#include "framework/random.h"
#include "layers/models.h"

namespace stillpoint::path_independence_test {
namespace {

TEST(PathIndependenceScore, MatchesAHandComputation) {
  // Sample 0: (1, 0) against (1, 1): cos = 1/sqrt(2); sample 1: (0, 2)
  // against (0, -2): cos = -1. Mean (1/sqrt(2) - 1) / 2.
  const Tensor a = Tensor::FromVector(Shape{2, 2}, {1, 0, 0, 2}, DType::kFloat64);
  const Tensor b = Tensor::FromVector(Shape{2, 2}, {1, 1, 0, -2}, DType::kFloat64);
  // Three rows of 2-class logits: argmax 0,1,1 against 0,0,1: 2 of 3 agree.
  const Tensor la = Tensor::FromVector(Shape{3, 2}, {2, 1, 0, 3, -1, 0}, DType::kFloat64);
  const Tensor lb = Tensor::FromVector(Shape{3, 2}, {5, 1, 4, 3, 0, 1}, DType::kFloat64);
  const PathIndependence score = ScorePathIndependence(a, b, la, lb);
  EXPECT_NEAR(score.cosine, (1.0 / std::sqrt(2.0) - 1.0) / 2.0, 1e-15);
  EXPECT_NEAR(score.agreement, 2.0 / 3.0, 1e-15);
  // A zero state against a zero state agrees; against a nonzero one it does not.
  const Tensor zero = Tensor::Zeros(Shape{1, 2}, DType::kFloat64);
  const Tensor one = Tensor::FromVector(Shape{1, 2}, {0, 1}, DType::kFloat64);
  EXPECT_EQ(ScorePathIndependence(zero, zero, la, la).cosine, 1.0);
  EXPECT_EQ(ScorePathIndependence(zero, one, la, la).cosine, 0.0);
  EXPECT_THROW(ScorePathIndependence(a, one, la, lb), Error);
}

ModelOptions Small(ModelKind kind) {
  ModelOptions o;
  o.kind = kind;
  o.vocab_size = 5;
  o.dim = 8;
  o.cell_options.heads = 2;
  o.cell_options.hidden = 16;
  o.unroll_steps = 3;
  o.num_layers = 2;
  o.dtype = DType::kFloat64;
  o.seed = 3;
  o.implicit.forward.max_iterations = 300;
  o.implicit.forward.absolute_tolerance = 1e-12;
  o.implicit.forward.relative_tolerance = 1e-12;
  return o;
}

const std::vector<int64_t> kIds = {1, 3, 0, 2, 4, 1, 2, 2};
const Shape kShape{2, 4};

// At initialisation the DEQ cell contracts: one fixed point whatever the
// start, so the score is 1 and every prediction agrees.
TEST(ComparePaths, AContractingModelReachesOneFixedPointFromEveryStart) {
  SequenceModel model(Small(ModelKind::kImplicit));
  model.Eval();
  Rng rng(1);
  const Var u = model.Embed(kIds, kShape);
  const PathIndependence score = model.ComparePaths(u, rng);
  EXPECT_NEAR(score.cosine, 1.0, 1e-9);
  EXPECT_EQ(score.agreement, 1.0);
  // The energy kind compares the block's start with that start plus noise.
  SequenceModel energy(Small(ModelKind::kEnergy));
  energy.Eval();
  const PathIndependence energy_score = energy.ComparePaths(energy.Embed(kIds, kShape), rng);
  EXPECT_LE(energy_score.cosine, 1.0 + 1e-12);
  EXPECT_GE(energy_score.agreement, 0.0);
  EXPECT_LE(energy_score.agreement, 1.0);
  SequenceModel tied(Small(ModelKind::kTied));
  EXPECT_THROW(tied.ComparePaths(tied.Embed(kIds, kShape), rng), Error);
}

// A training solve from a random start reaches the fixed point of the solve
// from zeros (the map contracts), by a different path (other iterates).
TEST(SolverInit, RandomAndMixedStartsReachTheSameFixedPoint) {
  SequenceModel reference(Small(ModelKind::kImplicit));
  reference.Train();
  const std::vector<double> expected = reference.Forward(kIds, kShape).value().ToVector();
  const double zeros_residual = reference.implicit()->forward_summary().abs_residual_trace.front();
  for (SolverInit init : {SolverInit::kRandom, SolverInit::kMixed}) {
    ModelOptions o = Small(ModelKind::kImplicit);
    o.solver_init = init;
    SequenceModel model(o);
    model.Train();
    const std::vector<double> got = model.Forward(kIds, kShape).value().ToVector();
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-8);
    EXPECT_NE(model.implicit()->forward_summary().abs_residual_trace.front(), zeros_residual)
        << ToString(init) << ": the solve did not start elsewhere";
  }
}

// n detached steps then k recorded ones: the value of n + k steps of the
// tied unroll, and gradients that reach only the k recorded steps.
TEST(ProgressiveLogits, ValuesOfTheUnrollAndGradientsOfTheLastSteps) {
  ModelOptions o = Small(ModelKind::kTied);
  o.unroll_steps = 5;
  SequenceModel tied(o);
  const Var u = tied.Embed(kIds, kShape);
  const std::vector<double> unrolled = tied.Forward(kIds, kShape).value().ToVector();
  const std::vector<double> progressive = tied.ProgressiveLogits(u, 3, 2).value().ToVector();
  for (std::size_t i = 0; i < unrolled.size(); ++i) ASSERT_NEAR(progressive[i], unrolled[i], 1e-12);
  // The detached part: with k = 1 after n = 4 the gradient of the cell's
  // first-layer weights is that of one step from a constant state, which
  // differs from the gradient through all five steps.
  const Var weight = tied.cell(0)->named_parameters().front().second;
  auto gradient_of = [&](const Var& logits) {
    tied.ZeroGrad();
    backward(sum(logits));
    return weight.grad().value().ToVector();
  };
  const std::vector<double> last_step = gradient_of(tied.ProgressiveLogits(tied.Embed(kIds, kShape), 4, 1));
  const std::vector<double> all_steps = gradient_of(tied.Forward(kIds, kShape));
  double difference = 0;
  for (std::size_t i = 0; i < last_step.size(); ++i) {
    difference = std::max(difference, std::abs(last_step[i] - all_steps[i]));
  }
  EXPECT_GT(difference, 1e-8);
  SequenceModel explicit_model(Small(ModelKind::kExplicit));
  EXPECT_THROW(explicit_model.ProgressiveLogits(u, 1, 1), Error);
}

// first_step: z0 = u and the cells get zeros, so the output is the cells
// applied to u with no injection.
TEST(InputInjection, FirstStepStartsFromTheInputAndInjectsNothing) {
  ModelOptions o = Small(ModelKind::kExplicit);
  o.input_injection = InputInjection::kFirstStep;
  SequenceModel model(o);
  const Var u = model.Embed(kIds, kShape);
  Var z = u;
  for (int64_t l = 0; l < model.num_cells(); ++l) z = model.cell(l)->Forward(z, zeros_like(u), {});
  ModelOptions every = o;
  every.input_injection = InputInjection::kEveryStep;
  SequenceModel recall(every);  // the same parameters (same seed)
  const std::vector<double> first = model.Forward(kIds, kShape).value().ToVector();
  const std::vector<double> injected = recall.Forward(kIds, kShape).value().ToVector();
  double difference = 0;
  for (std::size_t i = 0; i < first.size(); ++i) {
    difference = std::max(difference, std::abs(first[i] - injected[i]));
  }
  EXPECT_GT(difference, 1e-6);
  // The encoder states equal the hand-built stack.
  const std::vector<double> states = model.Encode(kIds, kShape).value().ToVector();
  const std::vector<double> by_hand = z.value().ToVector();
  for (std::size_t i = 0; i < states.size(); ++i) ASSERT_NEAR(states[i], by_hand[i], 1e-12);
}

}  // namespace
}  // namespace stillpoint::path_independence_test
