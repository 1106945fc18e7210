// The cell and model registries: built-ins, errors that list the known
// names, and a user's own cell used by every model kind.
#include "layers/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "framework/ops.h"
#include "layers/deq_cell.h"
#include "layers/linear.h"

namespace stillpoint::registry_test {
namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A user's cell: f(z; u) = tanh(z W + u) per token, with W [dim, dim].
class TanhCell : public Cell {
 public:
  TanhCell(const CellOptions& options, Rng& rng) {
    linear_ = RegisterModule(
        "w", std::make_shared<Linear>(options.dim, options.dim, rng,
                                      LinearOptions{.bias = false, .dtype = options.dtype}));
    const auto it = options.extra.find("gain");
    gain_ = it == options.extra.end() ? 0.5 : it->second;
  }
  std::string Name() const override { return "TanhCell"; }
  Var Forward(const Var& z, const Var& u, const std::vector<int64_t>&) const override {
    return tanh(add(mul_scalar(linear_->Forward(z), gain_), u));
  }

 private:
  std::shared_ptr<Linear> linear_;
  double gain_;
};

TEST(RegistryTest, BuiltInsAreRegistered) {
  EXPECT_TRUE(CellRegistry().Has("deq_transformer"));
  EXPECT_TRUE(ModelRegistry().Has("sequence"));
  EXPECT_TRUE(ModelRegistry().Has("classifier"));
  EXPECT_FALSE(CellRegistry().Description("deq_transformer").empty());
  Rng rng(1);
  auto cell = CreateCell("deq_transformer", {.dim = 8, .heads = 2, .hidden = 12}, rng);
  ASSERT_NE(dynamic_cast<DEQCell*>(cell.get()), nullptr);
  EXPECT_EQ(cell->parameter("fc1.weight").shape(), Shape({8, 12}));
  ModelOptions options;
  options.kind = ModelKind::kTied;
  options.dim = 8;
  options.cell_options.heads = 2;
  options.num_classes = 4;
  auto classifier = CreateModel("classifier", options);
  ASSERT_NE(dynamic_cast<SequenceClassifier*>(classifier.get()), nullptr);
  EXPECT_EQ(classifier->Forward({1, 2, 3, 4}, Shape{2, 2}).shape(), Shape({2, 4}));
}

TEST(RegistryTest, UnknownNameListsTheKnownOnes) {
  Rng rng(2);
  try {
    CreateCell("hopfeld", {}, rng);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("unknown cell 'hopfeld'"), std::string::npos) << message;
    EXPECT_NE(message.find("deq_transformer"), std::string::npos) << message;
  }
  try {
    CreateModel("transformer", {});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("classifier"), std::string::npos) << message;
    EXPECT_NE(message.find("sequence"), std::string::npos) << message;
  }
  ModelOptions options;
  options.cell = "no_such_cell";
  EXPECT_THROW(SequenceModel{options}, Error);
}

TEST(RegistryTest, UserCellWorksInEveryModelKind) {
  CellRegistry().Register(
      "test_tanh",
      [](const CellOptions& options, Rng& rng) -> std::shared_ptr<Cell> {
        return std::make_shared<TanhCell>(options, rng);
      },
      "tanh(z W + u)", /*replace=*/true);
  EXPECT_TRUE(Contains(CellRegistry().Names(), "test_tanh"));
  for (ModelKind kind : {ModelKind::kExplicit, ModelKind::kTied, ModelKind::kImplicit}) {
    ModelOptions options;
    options.kind = kind;
    options.vocab_size = 5;
    options.max_length = 4;
    options.dim = 6;
    options.num_layers = 2;
    options.cell = "test_tanh";
    options.cell_options.extra["gain"] = 0.3;
    SequenceModel model(options);
    EXPECT_TRUE(
        model.HasParameter(kind == ModelKind::kExplicit ? "cells.1.w.weight" : "cell.w.weight"));
    const Var loss = cross_entropy(model.Forward({0, 1, 2, 3, 4, 0}, Shape{2, 3}),
                                   std::vector<int64_t>{1, 2, 3, 4, 0, 1});
    backward(loss);
    // (cells.0 sees z = 0, so its W gets no gradient: check the second cell.)
    const Var w =
        model.parameter(kind == ModelKind::kExplicit ? "cells.1.w.weight" : "cell.w.weight");
    ASSERT_TRUE(w.has_grad()) << ToString(kind);
    EXPECT_GT(MaxAbsDiff(w.grad().value(), Tensor::Zeros(w.shape(), w.dtype())), 0.0);
  }
}

TEST(RegistryTest, DuplicateNamesNeedReplace) {
  Registry<int> registry("thing");
  registry.Register("a", 1);
  EXPECT_THROW(registry.Register("a", 2), Error);
  registry.Register("a", 3, "three", /*replace=*/true);
  EXPECT_EQ(registry.Get("a"), 3);
  EXPECT_EQ(registry.Description("a"), "three");
  EXPECT_THROW(registry.Register("", 4), Error);
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"a"});
}

}  // namespace
}  // namespace stillpoint::registry_test
