// The W1 model (bench/SPEC.md) at a tiny size against an independent float64
// implementation (tests/data/deq_tiny.json; see its "about" field):
//   - implicit model: the fixed point z*, the loss and the implicit gradient
//     of every parameter;
//   - explicit model (two untied cells): the loss and every gradient;
// all to 1e-8 relative: max |ours - reference| over a tensor, divided by the
// reference's largest entry, or by 1e-3 x the largest gradient entry of the
// model when that is larger. The floor matters for the key-projection bias,
// whose exact gradient is zero (softmax ignores a shift shared by all keys):
// both implementations return round-off there (~1e-18), which no relative
// test can compare. The forward solve and the adjoint solve run to tight
// tolerances in float64.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "framework/ops.h"
#include "layers/models.h"

#ifndef STILLPOINT_SOURCE_DIR
#error "STILLPOINT_SOURCE_DIR must name the source tree (set by tests/CMakeLists.txt)"
#endif

namespace stillpoint::deq_reference_test {
namespace {

constexpr double kRelativeTolerance = 1e-8;

const char* ReferencePath() { return STILLPOINT_SOURCE_DIR "/tests/data/deq_tiny.json"; }

Tensor ReadTensor(const YAML::Node& node) {
  std::vector<int64_t> dims;
  for (const YAML::Node& d : node["shape"]) dims.push_back(d.as<int64_t>());
  std::vector<double> data;
  for (const YAML::Node& v : node["data"]) data.push_back(v.as<double>());
  return Tensor::FromVector(Shape(dims), data, DType::kFloat64);
}

NamedTensors ReadTensors(const YAML::Node& map) {
  NamedTensors out;
  for (const auto& entry : map)
    out.emplace_back(entry.first.as<std::string>(), ReadTensor(entry.second));
  return out;
}

std::vector<int64_t> ReadIds(const YAML::Node& rows) {
  std::vector<int64_t> ids;
  for (const YAML::Node& row : rows) {
    for (const YAML::Node& id : row) ids.push_back(id.as<int64_t>());
  }
  return ids;
}

double LargestEntry(const Tensor& t) {
  double largest = 0;
  for (int64_t i = 0; i < t.numel(); ++i) largest = std::max(largest, std::abs(t.at(i)));
  return largest;
}

// The floor of the relative comparison of a model's gradients (see the top).
double GradientFloor(const NamedTensors& grads) {
  double largest = 0;
  for (const auto& [name, g] : grads) largest = std::max(largest, LargestEntry(g));
  return 1e-3 * largest;
}

// Compares one tensor and adds an llm.c-style line to *report:
//   OK      cell.wq.weight  [8, 8]  max diff 3.1e-15  (ours 0.12345, ref 0.12345)
bool Compare(const std::string& name,
             const Tensor& ours,
             const Tensor& reference,
             double floor,
             std::ostringstream* report) {
  if (ours.shape() != reference.shape()) {
    *report << "NOT OK  " << name << ": shape " << ours.shape() << " vs reference "
            << reference.shape() << "\n";
    return false;
  }
  const double largest = std::max(LargestEntry(reference), floor);
  const double diff = MaxAbsDiff(ours, reference);
  const bool ok = diff <= kRelativeTolerance * largest;
  *report << (ok ? "OK      " : "NOT OK  ") << std::left << std::setw(18) << name << " "
          << std::setw(8) << reference.shape().ToString() << " max diff " << std::setprecision(3)
          << diff << " (rel " << (largest > 0 ? diff / largest : diff) << ")  first: ours "
          << std::setprecision(12) << ours.at(0) << ", ref " << reference.at(0) << "\n";
  return ok;
}

// Compares the gradient of every parameter named in grads (after a
// backward pass) and checks that every parameter of the model is named.
bool CompareEveryGradient(const SequenceModel& model,
                          const NamedTensors& grads,
                          std::ostringstream* report) {
  bool all_ok = true;
  const double floor = GradientFloor(grads);
  int compared = 0;
  for (const auto& [name, reference_grad] : grads) {
    const Var p = model.parameter(name);
    if (!p.has_grad()) {
      *report << "NOT OK  " << name << " got no gradient\n";
      all_ok = false;
      continue;
    }
    all_ok &= Compare("d/d " + name, p.grad().value(), reference_grad, floor, report);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(model.parameters().size()));
  return all_ok;
}

struct Reference {
  YAML::Node root;
  ModelOptions options;
  std::vector<int64_t> x;
  std::vector<int64_t> y;
  Shape ids_shape;

  Reference() {
    root = YAML::LoadFile(ReferencePath());
    const YAML::Node config = root["config"];
    options.vocab_size = config["V"].as<int64_t>();
    options.max_length = config["T"].as<int64_t>();
    options.dim = config["d"].as<int64_t>();
    options.cell_options.heads = config["heads"].as<int64_t>();
    options.cell_options.hidden = config["hidden"].as<int64_t>();
    options.dtype = DType::kFloat64;
    x = ReadIds(root["x"]);
    y = ReadIds(root["y"]);
    ids_shape = Shape{config["B"].as<int64_t>(), config["T"].as<int64_t>()};
  }
};

TEST(DEQReferenceTest, ImplicitModelMatchesFixedPointLossAndEveryGradient) {
  Reference ref;
  ModelOptions options = ref.options;
  options.kind = ModelKind::kImplicit;
  // Tight solves: the reference's residuals are ~1e-15.
  options.implicit.forward.type = ForwardSolverType::kAnderson;
  options.implicit.forward.stop_mode = StopMode::kAbsolute;
  options.implicit.forward.absolute_tolerance = 1e-13;
  options.implicit.forward.max_iterations = 300;
  options.implicit.forward.stagnation_window = 0;
  options.implicit.backward.mode = BackwardMode::kIft;
  options.implicit.backward.solver = AdjointSolverType::kGmres;
  options.implicit.backward.tolerance = 1e-14;
  options.implicit.backward.max_iterations = 300;
  SequenceModel model(options);
  const YAML::Node implicit = ref.root["implicit"];
  model.LoadParameters(ReadTensors(implicit["params"]));  // strict: every name must match

  const Var logits = model.Forward(ref.x, ref.ids_shape);
  const Var loss = cross_entropy(logits, ref.y);
  backward(loss);

  const SolverSummary& forward = model.implicit()->forward_summary();
  EXPECT_EQ(forward.termination_type, TerminationType::kConverged) << forward.FullReport();
  ASSERT_NE(model.implicit()->backward_summary(), nullptr);
  EXPECT_EQ(model.implicit()->backward_summary()->termination_type, TerminationType::kConverged)
      << model.implicit()->backward_summary()->FullReport();

  std::ostringstream report;
  bool all_ok = true;
  // z*: the model's final states before the head (f(z*) = z* at the fixed point).
  {
    NoGrad no_grad;
    const Tensor z_star = model.Encode(ref.x, ref.ids_shape).value();
    all_ok &= Compare("z_star", z_star, ReadTensor(implicit["z_star"]), 0.0, &report);
  }
  all_ok &= Compare("loss", loss.value(),
                    Tensor::Scalar(implicit["loss"].as<double>(), DType::kFloat64), 0.0, &report);
  all_ok &= CompareEveryGradient(model, ReadTensors(implicit["grads"]), &report);
  EXPECT_TRUE(all_ok) << report.str();
  std::cout << "implicit model vs reference:\n" << report.str();
}

TEST(DEQReferenceTest, ExplicitTwoCellModelMatchesLossAndEveryGradient) {
  Reference ref;
  ModelOptions options = ref.options;
  options.kind = ModelKind::kExplicit;
  const YAML::Node explicit_model = ref.root["explicit"];
  options.num_layers = explicit_model["n_layers"].as<int64_t>();
  SequenceModel model(options);
  model.LoadParameters(ReadTensors(explicit_model["params"]));

  const Var loss = cross_entropy(model.Forward(ref.x, ref.ids_shape), ref.y);
  backward(loss);

  std::ostringstream report;
  bool all_ok =
      Compare("loss", loss.value(),
              Tensor::Scalar(explicit_model["loss"].as<double>(), DType::kFloat64), 0.0, &report);
  all_ok &= CompareEveryGradient(model, ReadTensors(explicit_model["grads"]), &report);
  EXPECT_TRUE(all_ok) << report.str();
  std::cout << "explicit model vs reference:\n" << report.str();
}

TEST(DEQReferenceTest, ParameterNamesAndOrderMatchTheReference) {
  Reference ref;
  for (ModelKind kind : {ModelKind::kImplicit, ModelKind::kExplicit}) {
    ModelOptions options = ref.options;
    options.kind = kind;
    options.num_layers = 2;
    SequenceModel model(options);
    const YAML::Node params =
        ref.root[kind == ModelKind::kImplicit ? "implicit" : "explicit"]["params"];
    std::vector<std::string> expected;
    for (const auto& entry : params) expected.push_back(entry.first.as<std::string>());
    std::vector<std::string> names;
    for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
    EXPECT_EQ(names, expected) << ToString(kind);
  }
}

}  // namespace
}  // namespace stillpoint::deq_reference_test
