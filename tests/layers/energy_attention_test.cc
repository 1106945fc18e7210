// Energy attention as the attention sublayer of a transformer cell
// (model.attention): for every built-in block, the whole model's gradient
// through the nested inner solve agrees with backprop through a long unroll
// of the inner updates and with central differences; probabilistic attention
// with value precision 0 is the cell's softmax attention; the collapse
// diagnostics see a collapse.

#include "layers/energy_attention.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "layers/deq_cell.h"
#include "layers/models.h"
#include "layers/probabilistic_attention.h"
#include "tests/layers/energy_test_util.h"

namespace stillpoint::energy_attention_test {
namespace {

using testing_energy::Randn;
using testing_energy::RandnVar;

const std::vector<std::string>& BuiltinBlocks() {
  static const std::vector<std::string> names = {"hopfield", "probabilistic", "expfam",
                                                 "energy_transformer"};
  return names;
}

// A float64 sequence model over feature inputs whose cell's attention is
// `attention`, solved tightly (inner and, for the implicit kind, outer).
ModelOptions AttentionModel(const std::string& attention, ModelKind kind, int64_t dim) {
  ModelOptions options;
  options.kind = kind;
  options.vocab_size = 3;
  options.feature_dim = 3;
  options.max_length = 4;
  options.dim = dim;
  options.num_layers = 2;
  options.cell_options.heads = 2;
  options.cell_options.hidden = dim;
  options.cell_options.attention = attention;
  options.cell_options.energy.memories = 5;
  options.dtype = DType::kFloat64;
  options.seed = 11;
  // The outer map contains the inner solves, so it is exact only to their
  // tolerance: the outer one is set 10 times looser than the inner one. An
  // outer solve stopped at 1e-11 puts up to 1e-11 / h = 1e-6 of noise into
  // a difference quotient of step h = 1e-5 (the expfam implicit model's
  // check failed on it, at 2.5e-7).
  options.implicit = testing_energy::TightImplicitOptions();
  options.implicit.forward.absolute_tolerance = 1e-12;
  options.cell_options.attention_solver = testing_energy::TightImplicitOptions();
  return options;
}

struct Agreement {
  double cosine = 0.0, relative_error = 0.0;
};

Agreement Compare(const std::vector<double>& a, const std::vector<double>& reference) {
  double dot = 0.0, aa = 0.0, rr = 0.0, diff = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    dot += a[i] * reference[i];
    aa += a[i] * a[i];
    rr += reference[i] * reference[i];
    diff += (a[i] - reference[i]) * (a[i] - reference[i]);
  }
  return {dot / std::sqrt(aa * rr), std::sqrt(diff / rr)};
}

struct Case {
  std::string attention;
  ModelKind kind;
};

class EnergyAttentionGradientTest : public ::testing::TestWithParam<Case> {};

// The implicit gradient of the inner solve, nested in an explicit stack or
// in the outer fixed point, against backprop through 300 inner updates
// (inner backward mode "unrolled" from the block's initial state; the outer
// solve, when there is one, stays the exact implicit gradient).
TEST_P(EnergyAttentionGradientTest, ImplicitGradientMatchesALongUnroll) {
  const Case c = GetParam();
  SequenceModel model(AttentionModel(c.attention, c.kind, 32));
  Rng rng(4);
  const Var features = RandnVar({2, 4, 3}, rng);
  const Tensor probe = Randn({2, 4, 3}, rng);
  const std::vector<double> implicit = testing_energy::ModelGradient(model, features, probe);
  for (const auto& [name, attention] : FindEnergyAttentions(model)) {
    EXPECT_EQ(attention->implicit().forward_summary().termination_type,
              TerminationType::kConverged)
        << name << ": " << attention->implicit().forward_summary().BriefReport();
    ASSERT_NE(attention->implicit().backward_summary(), nullptr) << name;
    EXPECT_EQ(attention->implicit().backward_summary()->termination_type,
              TerminationType::kConverged)
        << name << ": " << attention->implicit().backward_summary()->BriefReport();
    ImplicitOptions& inner = attention->implicit().mutable_options();
    inner.backward.mode = BackwardMode::kUnrolled;
    inner.backward.unrolled_steps = 300;
  }
  const std::vector<double> unrolled = testing_energy::ModelGradient(model, features, probe);
  const Agreement a = Compare(implicit, unrolled);
  EXPECT_GE(a.cosine, 0.9999);
  EXPECT_LE(a.relative_error, 1e-4);
}

// The same gradient against central differences of the converged solves
// (tiny width), with respect to the inputs and the last attention's own
// parameters; for the implicit model, where every difference quotient costs
// two nested tight solves, on one sequence of two tokens.
TEST_P(EnergyAttentionGradientTest, MatchesFiniteDifferencesOfTheConvergedSolves) {
  const Case c = GetParam();
  const bool nested = c.kind == ModelKind::kImplicit;
  SequenceModel model(AttentionModel(c.attention, c.kind, 4));
  Rng rng(5);
  const Var features = RandnVar(nested ? Shape{1, 2, 3} : Shape{2, 3, 3}, rng);
  const double abs_tol = c.attention == "energy_transformer" ? 5e-7 : 1e-8;
  auto r = CheckGradients([&](const VarList& in) { return model.ForwardFeatures(in[0]); },
                          {features}, testing_energy::SolveGradCheckOptions(abs_tol));
  EXPECT_TRUE(r) << r;
  const Tensor probe = Randn(features.shape(), rng);
  const auto attentions = FindEnergyAttentions(model);
  ASSERT_FALSE(attentions.empty());
  // The attention that reads the model's real state: the last cell's (the
  // first cell of an explicit stack reads the zero state, see the note in
  // docs/energy-layers.md on the Energy Transformer there).
  auto& attention = const_cast<EnergyAttention&>(*attentions.back().second);
  auto p = testing_energy::CheckParameterGradients(
      attention, [&] { return sum(mul(model.ForwardFeatures(features), Var(probe))); }, 1e-5,
      1e-5, abs_tol);
  EXPECT_TRUE(p) << attentions.back().first << ": " << p;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& name : BuiltinBlocks()) {
    cases.push_back({name, ModelKind::kExplicit});
    cases.push_back({name, ModelKind::kImplicit});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Builtins,
                         EnergyAttentionGradientTest,
                         ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.attention + "_" + ToString(info.param.kind);
                         });

// The first cell of an explicit stack reads the zero state: its block's
// input is LN(0) = norm.bias, the same for every token, and at
// initialisation (norm.bias = 0, delta = 0) the energy layer norm gives g = 0,
// so every relu^2 memory's pre-activation xi.g is exactly 0: on the kink,
// where relu' jumps from 0 to 1. The cell's output is not differentiable
// there in delta and norm.bias (central differences average the two
// one-sided slopes; backprop takes relu'(0) = 0), which is the gap between
// the two seen at that cell. Off the kink (a random norm.bias), or with the
// smooth softmax memory on it, the same check passes as tightly as the last
// cell's.
TEST(EnergyAttentionTest, EnergyTransformerAtTheZeroStateDiffersFromDifferencesOnlyOnTheReluKink) {
  Rng rng(5);
  const Var features = RandnVar({2, 3, 3}, rng);
  const Tensor probe = Randn(features.shape(), rng);
  for (const char* setting : {"on the kink", "off the kink", "softmax memory"}) {
    SCOPED_TRACE(setting);
    ModelOptions options = AttentionModel("energy_transformer", ModelKind::kExplicit, 4);
    const std::string s = setting;
    if (s == "softmax memory") options.cell_options.energy.memory = EnergyTransformerMemory::kSoftmax;
    SequenceModel model(options);
    auto& first = const_cast<EnergyAttention&>(*FindEnergyAttentions(model).front().second);
    if (s == "off the kink") {
      Rng shift(12);
      first.parameter("block.norm.bias").mutable_value().CopyFrom(Randn({4}, shift, 0.3));
    }
    auto check = testing_energy::CheckParameterGradients(
        first, [&] { return sum(mul(model.ForwardFeatures(features), Var(probe))); }, 1e-5, 1e-5,
        5e-7);
    if (s == "on the kink") {
      EXPECT_FALSE(check.ok) << "the zero state no longer sits on the memories' kink";
    } else {
      EXPECT_TRUE(check.ok) << check;
    }
  }
}

// Probabilistic attention with value precision 0, no input norm and the
// softmax attention's weights is that attention: the cell's output agrees
// to rounding in float64, and with a value precision of 1e-12 (beta_v
// = 1e-12 / dh, learned in log space) still to 1e-12.
TEST(EnergyAttentionTest, ProbabilisticAtZeroValuePrecisionIsTheCellsSoftmaxAttention) {
  for (double value_precision : {0.0, 1e-12}) {
    SCOPED_TRACE(value_precision);
    CellOptions softmax;
    softmax.dim = 16;
    softmax.heads = 2;
    softmax.hidden = 24;
    softmax.dtype = DType::kFloat64;
    CellOptions energy = softmax;
    energy.attention = "probabilistic";
    energy.energy.value_precision = value_precision;
    energy.energy.normalize_input = false;
    Rng a(1), b(2);
    DEQCell reference(softmax, a);
    DEQCell cell(energy, b);
    // Same projections (the probabilistic block has no biases: zero them),
    // same norms and feed-forward.
    for (auto& [name, p] : reference.named_parameters()) {
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0 &&
          name.rfind("w", 0) == 0) {
        p.mutable_value().CopyFrom(Tensor::Zeros(p.shape(), DType::kFloat64));
      }
    }
    for (auto& [name, p] : cell.named_parameters()) {
      std::string source = name;
      if (name.rfind("attention.block.layer.", 0) == 0) {
        source = name.substr(std::string("attention.block.layer.").size());
      }
      if (source.rfind("log_", 0) == 0) continue;  // the precisions keep their defaults
      p.mutable_value().CopyFrom(reference.parameter(source).value());
    }
    Rng rng(3);
    const Var z = RandnVar({2, 5, 16}, rng);
    const Var u = RandnVar({2, 5, 16}, rng);
    const Tensor expected = reference.Forward(z, u).value();
    const Tensor got = cell.Forward(z, u).value();
    EXPECT_LT(MaxAbsDiff(got, expected), 1e-12);
  }
}

// The diagnostics see a collapse: a value precision far above the default
// (value term of scale about 8 instead of about 0.7), without the block's
// value contraction, snaps the fixed point onto single keys where the first
// iterate was spread; the default operating point does not, and neither does
// that precision with the contraction (its EM map cannot expand, so the
// fixed point stays near the first iterate).
TEST(EnergyAttentionTest, DiagnosticsFlagACollapseAndNotTheDefault) {
  struct Case {
    double value_precision, value_contraction;
    bool collapses;
  };
  for (const Case c : {Case{2.0, 0.9, false}, Case{24.0, 0.9, false}, Case{24.0, 0.0, true}}) {
    const double value_precision = c.value_precision;
    SCOPED_TRACE(::testing::Message() << value_precision << ", contraction " << c.value_contraction);
    EnergyAttentionOptions options;
    options.block.layer = "probabilistic";
    options.block.dim = 32;
    options.block.heads = 2;
    options.block.value_precision = value_precision;
    options.block.value_contraction = c.value_contraction;
    options.block.dtype = DType::kFloat64;
    // Plain EM steps (Picard) never raise the energy; an accelerated solve
    // may, so the monotonicity check is made on these.
    options.solver.forward.type = ForwardSolverType::kPicard;
    options.solver.forward.max_iterations = 300;
    Rng rng(6);
    EnergyAttention attention(options, rng);
    const Var x = RandnVar({2, 8, 32}, rng);
    const AttentionDiagnostics d = attention.Diagnose(x);
    SCOPED_TRACE(::testing::Message()
                 << "max weight " << d.max_weight_first << " -> " << d.max_weight_fixed_point
                 << ", entropy " << d.entropy_first << " -> " << d.entropy_fixed_point);
    EXPECT_TRUE(d.energy_monotone);
    EXPECT_GT(d.iterations, 0);
    if (c.collapses) {
      EXPECT_GT(d.max_weight_fixed_point, 0.9);
      EXPECT_LT(d.entropy_fixed_point, 0.5 * d.entropy_first);
      EXPECT_TRUE(d.collapsed);
    } else {
      EXPECT_LT(d.max_weight_fixed_point, 0.9);
      EXPECT_LT(d.relative_move, 1.0);
      EXPECT_FALSE(d.collapsed);
    }
  }
}

// Any setting of the optimiser leaves the probabilistic precisions
// positive: they are stored as logarithms.
TEST(EnergyAttentionTest, ProbabilisticPrecisionsArePositiveByConstruction) {
  EnergyBlockOptions options;
  options.layer = "probabilistic";
  options.dim = 8;
  options.heads = 2;
  options.dtype = DType::kFloat64;
  Rng rng(7);
  std::shared_ptr<EnergyBlock> block = CreateEnergyBlock(options, rng);
  auto& layer = static_cast<ProbabilisticAttention&>(*block->layer());
  EXPECT_NEAR(layer.query_precision().value().at(0), 0.5, 1e-15);        // 1/sqrt(4)
  EXPECT_NEAR(layer.value_precision().value().at(0), 2.0 / 4.0, 1e-15);  // value_precision / dh
  // A step that would take a directly parametrised precision far below 0.
  for (auto& [name, p] : block->named_parameters()) {
    if (name.find("precision") != std::string::npos) {
      p.mutable_value().CopyFrom(Tensor::Full(p.shape(), -60.0, DType::kFloat64));
    }
  }
  EXPECT_GT(layer.query_precision().value().at(0), 0.0);
  EXPECT_GT(layer.value_precision().value().at(1), 0.0);
  const Var x = RandnVar({1, 3, 8}, rng);
  const EnergyBlockProblemPtr problem = block->Prepare(x);  // checks the precisions, must not throw
  EXPECT_EQ(problem->initial_state.shape(), Shape({1, 2, 3, 4}));
}

// A float64 Energy Transformer attention (8 wide, 2 heads, 5 memories),
// solved tightly, its weights scaled by `scale` (larger: less contracting).
EnergyAttentionOptions SmallEnergyTransformer() {
  EnergyAttentionOptions options;
  options.block.layer = "energy_transformer";
  options.block.dim = 8;
  options.block.heads = 2;
  options.block.memories = 5;
  options.block.dtype = DType::kFloat64;
  options.solver = testing_energy::TightImplicitOptions();
  return options;
}

// Per sample, the largest |eigenvalue| of the Jacobian of the block's update
// map at `state` for input x, from central differences and a dense
// eigensolver: independent of the Arnoldi estimate under test.
std::vector<double> DenseUpdateRadius(const EnergyBlock& block, const Var& x,
                                      const Tensor& state) {
  NoGrad no_grad;
  const EnergyBlockProblemPtr problem = block.Prepare(x);
  const int64_t batch = state.dim(0);
  const int64_t n = state.numel() / batch;
  const double h = 1e-6;
  std::vector<Eigen::MatrixXd> jacobians(batch, Eigen::MatrixXd::Zero(n, n));
  for (int64_t j = 0; j < n; ++j) {
    Tensor plus = state.Clone(), minus = state.Clone();
    for (int64_t b = 0; b < batch; ++b) {
      plus.set(b * n + j, plus.at(b * n + j) + h);
      minus.set(b * n + j, minus.at(b * n + j) - h);
    }
    const Tensor up = problem->energy->Update(Var(plus)).value();
    const Tensor down = problem->energy->Update(Var(minus)).value();
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < n; ++i) {
        jacobians[b](i, j) = (up.at(b * n + i) - down.at(b * n + i)) / (2 * h);
      }
    }
  }
  std::vector<double> radius;
  for (const Eigen::MatrixXd& jacobian : jacobians) {
    radius.push_back(Eigen::EigenSolver<Eigen::MatrixXd>(jacobian).eigenvalues().cwiseAbs().maxCoeff());
  }
  return radius;
}

// Scales every parameter of the attention's block by `factor`.
void ScaleParameters(const EnergyAttention& attention, double factor) {
  for (const Var& p : attention.block().parameters()) {
    Tensor value = p.value();
    for (int64_t i = 0; i < value.numel(); ++i) value.set(i, value.at(i) * factor);
  }
}

// The diagnostics' spectral radius is the largest |eigenvalue| of the update
// map's Jacobian at the solved state, over the samples.
TEST(EnergyAttentionTest, DiagnosedSpectralRadiusIsTheUpdateJacobiansLargestEigenvalue) {
  Rng rng(3);
  EnergyAttention attention(SmallEnergyTransformer(), rng);
  ScaleParameters(attention, 3.0);  // away from the initial, nearly-zero map
  const Var x = RandnVar({2, 3, 8}, rng);
  attention.KeepInputs(true);
  attention.Forward(x);
  const std::vector<double> dense = DenseUpdateRadius(attention.block(), x, attention.last_state());
  const double largest = *std::max_element(dense.begin(), dense.end());
  ASSERT_GT(largest, 0.05);
  const AttentionDiagnostics d = attention.Diagnose(x);
  EXPECT_NEAR(d.spectral_radius, largest, 1e-5 * largest);
  EXPECT_NEAR(std::abs(d.dominant_eigenvalue), largest, 1e-3 * largest);
}

// The attention penalty is the hinge of each sample's radius at the kept
// solution, a step against its gradient lowers the radius, and the slowest
// kept solve (here one stopped after a single iteration) is penalised beside
// the last when it came before it.
TEST(EnergyAttentionTest, SpectralRadiusPenaltyIsTheHingeAtTheKeptSolves) {
  Rng rng(4);
  EnergyAttention attention(SmallEnergyTransformer(), rng);
  ScaleParameters(attention, 3.0);
  const Var x = RandnVar({2, 3, 8}, rng);
  const Var slow_x = RandnVar({2, 3, 8}, rng);
  attention.KeepInputs(true);
  EXPECT_THROW(attention.SpectralRadiusPenalty(0.0, {}), Error);  // nothing kept yet

  attention.Forward(x);
  const std::vector<double> radius = DenseUpdateRadius(attention.block(), x, attention.last_state());
  double mean_square = 0.0;
  for (double r : radius) mean_square += r * r / static_cast<double>(radius.size());
  const double at_x = attention.SpectralRadiusPenalty(0.0, {}).value().item();
  EXPECT_NEAR(at_x, mean_square, 1e-4 * mean_square);
  const double above = *std::max_element(radius.begin(), radius.end()) + 0.01;
  EXPECT_EQ(attention.SpectralRadiusPenalty(above, {}).value().item(), 0.0);

  // One gradient step on the penalty lowers the largest radius.
  std::vector<Var> parameters = attention.block().parameters();
  for (Var p : parameters) p.zero_grad();
  backward(attention.SpectralRadiusPenalty(0.0, {}));
  for (const Var& p : parameters) {
    if (!p.grad().defined()) continue;
    Tensor value = p.value();
    for (int64_t i = 0; i < value.numel(); ++i) value.set(i, value.at(i) - 0.05 * p.grad().value().at(i));
  }
  attention.ForgetKeptInputs();
  attention.Forward(x);
  const std::vector<double> after = DenseUpdateRadius(attention.block(), x, attention.last_state());
  EXPECT_LT(*std::max_element(after.begin(), after.end()),
            *std::max_element(radius.begin(), radius.end()));

  // The penalty at a solve stopped after one iteration, alone and before or
  // after a converged one.
  const auto slow_forward = [&] {
    attention.implicit().mutable_options().forward.max_iterations = 1;
    attention.Forward(slow_x);
    attention.implicit().mutable_options().forward.max_iterations = 300;
  };
  attention.ForgetKeptInputs();
  slow_forward();
  const double slow = attention.SpectralRadiusPenalty(0.0, {}).value().item();
  attention.ForgetKeptInputs();
  attention.Forward(x);
  const double converged = attention.SpectralRadiusPenalty(0.0, {}).value().item();
  ASSERT_GT(std::abs(slow - converged), 1e-3 * converged);
  attention.ForgetKeptInputs();
  slow_forward();
  attention.Forward(x);
  EXPECT_NEAR(attention.SpectralRadiusPenalty(0.0, {}).value().item(), slow + converged,
              1e-9 * (slow + converged));
  attention.ForgetKeptInputs();
  attention.Forward(x);
  slow_forward();  // the slowest is the last: penalised once
  EXPECT_NEAR(attention.SpectralRadiusPenalty(0.0, {}).value().item(), slow, 1e-9 * slow);
  attention.ForgetKeptInputs();
  EXPECT_THROW(attention.SpectralRadiusPenalty(0.0, {}), Error);
}

}  // namespace
}  // namespace stillpoint::energy_attention_test
