// SequenceModel's regularisers at its own fixed point
// (model.regularization.jacobian_* and spectral_radius_*), for the implicit
// kind (the cell's map) and the energy kind (the energy block's update):
// the Jacobian penalty's parameter gradient matches central finite
// differences in float64; the spectral-radius penalty is the hinge on the
// model's own estimate and reaches the map's parameters; other kinds are
// refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "layers/models.h"
#include "tests/layers/module_gradcheck.h"

namespace stillpoint::fixed_point_penalties_test {
namespace {

const std::vector<int64_t> kIds = {1, 3, 0, 2, 4, 4, 1, 0};
const Shape kShape{2, 4};

ModelOptions Float64Model(ModelKind kind, const std::string& energy_layer = "probabilistic") {
  ModelOptions options;
  options.kind = kind;
  options.vocab_size = 5;
  options.max_length = 4;
  options.dim = 8;
  options.cell_options.heads = 2;
  options.cell_options.hidden = 12;
  options.energy.heads = 2;
  options.energy.layer = energy_layer;
  options.energy.memories = 6;
  options.dtype = DType::kFloat64;
  options.implicit.forward.max_iterations = 200;
  options.implicit.forward.stop_mode = StopMode::kAbsolute;
  options.implicit.forward.absolute_tolerance = 1e-12;
  options.seed = 7;
  return options;
}

TEST(FixedPointPenaltiesTest, JacobianPenaltyGradientMatchesFiniteDifferences) {
  for (const ModelKind kind : {ModelKind::kImplicit, ModelKind::kEnergy}) {
    SCOPED_TRACE(ToString(kind));
    SequenceModel model(Float64Model(kind));
    model.Forward(kIds, kShape);
    const auto penalty = [&](const VarList&) {
      Rng probes(3);  // the same probes at every evaluation
      return model.FixedPointJacobianPenalty(model.Embed(kIds, kShape), 2, probes);
    };
    EXPECT_GT(penalty({}).item(), 0.0);
    const GradCheckResult result = testing_support::CheckModuleGradients(model, penalty, {});
    EXPECT_TRUE(result.ok) << result.log;
    EXPECT_GT(result.entries_checked, 50);
    EXPECT_FALSE(result.all_zero);
  }
}

TEST(FixedPointPenaltiesTest, SpectralRadiusPenaltyIsTheHingeOnTheModelsEstimate) {
  for (const ModelKind kind : {ModelKind::kImplicit, ModelKind::kEnergy}) {
    SCOPED_TRACE(ToString(kind));
    SequenceModel model(Float64Model(kind));
    model.Forward(kIds, kShape);
    SpectralRadiusOptions estimate;
    estimate.max_iterations = 500;
    estimate.tolerance = 1e-12;
    const SpectralRadiusResult radius =
        model.FixedPointSpectralRadius(model.Embed(kIds, kShape), estimate);
    ASSERT_EQ(radius.radius.size(), 2u);
    EXPECT_GT(radius.max_radius, 0.0);
    const double target = 0.5 * radius.max_radius;
    double expected = 0.0;
    for (double r : radius.radius) expected += std::pow(std::max(0.0, r - target), 2) / 2.0;
    const Var penalty =
        model.FixedPointSpectralRadiusPenalty(model.Embed(kIds, kShape), target, estimate);
    EXPECT_NEAR(penalty.item(), expected, 1e-9 * expected);
    // The penalty reaches the parameters of the map (the cell or the block).
    VarList parameters;
    for (const auto& [name, p] : model.named_parameters()) {
      if (name.rfind("cell.", 0) == 0 || name.rfind("block.", 0) == 0) parameters.push_back(p);
    }
    ASSERT_FALSE(parameters.empty());
    double squared = 0.0;
    for (const Var& g : grad({penalty}, parameters)) {
      if (!g.defined()) continue;
      for (double v : g.value().ToVector()) squared += v * v;
    }
    EXPECT_GT(squared, 0.0);
    // Over named rows: the mean of the hinge over those rows' radii alone.
    for (const std::vector<int64_t>& rows : {std::vector<int64_t>{1}, std::vector<int64_t>{1, 0}}) {
      double over_rows = 0.0;
      for (int64_t row : rows) {
        over_rows += std::pow(std::max(0.0, radius.radius[static_cast<std::size_t>(row)] - target),
                              2) /
                     static_cast<double>(rows.size());
      }
      EXPECT_NEAR(model
                      .FixedPointSpectralRadiusPenalty(model.Embed(kIds, kShape), target,
                                                       estimate, rows)
                      .item(),
                  over_rows, 1e-9 * expected)
          << rows.size() << " rows";
    }
    for (const std::vector<int64_t>& bad : {std::vector<int64_t>{2}, std::vector<int64_t>{1, 1}}) {
      EXPECT_THROW(
          model.FixedPointSpectralRadiusPenalty(model.Embed(kIds, kShape), target, estimate, bad),
          Error);
    }
    // Above every sample's radius nothing is penalised.
    EXPECT_EQ(model
                  .FixedPointSpectralRadiusPenalty(model.Embed(kIds, kShape),
                                                   1.01 * radius.max_radius, estimate)
                  .item(),
              0.0);
  }
}

TEST(FixedPointPenaltiesTest, ModelsWithoutAFixedPointOfTheirOwnAreRefused) {
  for (const ModelKind kind : {ModelKind::kExplicit, ModelKind::kTied}) {
    SCOPED_TRACE(ToString(kind));
    ModelOptions options = Float64Model(kind);
    options.unroll_steps = 2;
    SequenceModel model(options);
    model.Forward(kIds, kShape);
    Rng rng(1);
    EXPECT_THROW(model.FixedPointJacobianPenalty(model.Embed(kIds, kShape), 1, rng), Error);
    EXPECT_THROW(model.FixedPointSpectralRadius(model.Embed(kIds, kShape)), Error);
  }
  // An implicit model before its first Forward has no fixed point yet.
  SequenceModel fresh(Float64Model(ModelKind::kImplicit));
  EXPECT_THROW(fresh.FixedPoint(), Error);
}

}  // namespace
}  // namespace stillpoint::fixed_point_penalties_test
