#include "framework/module.h"

#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "framework/random.h"

namespace stillpoint::module_test {
namespace {

// Expects `statement` to throw stillpoint::Error whose message contains every
// one of the given fragments.
#define EXPECT_ERROR_CONTAINS(statement, ...)                         \
  do {                                                                \
    try {                                                             \
      statement;                                                      \
      ADD_FAILURE() << "expected stillpoint::Error from " #statement; \
    } catch (const ::stillpoint::Error& error) {                      \
      const std::string message = error.what();                       \
      for (const std::string fragment : {__VA_ARGS__}) {              \
        EXPECT_NE(message.find(fragment), std::string::npos)          \
            << "message: " << message << "\nmissing: " << fragment;   \
      }                                                               \
    }                                                                 \
  } while (false)

constexpr DType kF32 = DType::kFloat32;

class Attention : public Module {
 public:
  explicit Attention(int64_t d) {
    wq_ = RegisterParameter("wq", Tensor::Full({d, d}, 1.0, kF32));
    wk_ = RegisterParameter("wk", Tensor::Full({d, d}, 2.0, kF32));
  }
  std::string Name() const override { return "Attention"; }
  const Var& wq() const { return wq_; }

 private:
  Var wq_, wk_;
};

class Cell : public Module {
 public:
  explicit Cell(int64_t d) {
    attn_ = RegisterModule("attn", std::make_shared<Attention>(d));
    bias_ = RegisterParameter("bias", Tensor::Zeros({d}, kF32));
  }
  std::string Name() const override { return "Cell"; }
  const std::shared_ptr<Attention>& attn() const { return attn_; }

 private:
  std::shared_ptr<Attention> attn_;
  Var bias_;
};

class Net : public Module {
 public:
  Net(int64_t d, int num_cells) {
    embed_ = RegisterParameter("embed", Tensor::Ones({5, d}, kF32));
    cells_ = RegisterModule("cells", std::make_shared<ModuleList>());
    for (int i = 0; i < num_cells; ++i) cells_->Append(std::make_shared<Cell>(d));
    head_ = RegisterParameter("head", Tensor::Ones({d, 3}, kF32));
  }
  std::string Name() const override { return "Net"; }
  const std::shared_ptr<ModuleList>& cells() const { return cells_; }

 private:
  Var embed_, head_;
  std::shared_ptr<ModuleList> cells_;
};

std::vector<std::string> Names(const NamedVars& named) {
  std::vector<std::string> names;
  for (const auto& [name, p] : named) names.push_back(name);
  return names;
}

TEST(ModuleTest, NestedNamesFollowRegistrationOrder) {
  Net net(4, 2);
  const std::vector<std::string> expected = {
      "embed",           "head",         "cells.0.bias",    "cells.0.attn.wq",
      "cells.0.attn.wk", "cells.1.bias", "cells.1.attn.wq", "cells.1.attn.wk"};
  EXPECT_EQ(Names(net.named_parameters()), expected);
  // parameters() is the same list, in the same order.
  const VarList flat = net.parameters();
  const NamedVars named = net.named_parameters();
  ASSERT_EQ(flat.size(), named.size());
  for (std::size_t i = 0; i < flat.size(); ++i) EXPECT_EQ(flat[i].node(), named[i].second.node());
}

TEST(ModuleTest, CountsScalarParameters) {
  Net net(4, 2);
  // embed 5x4 + head 4x3 + 2 cells x (bias 4 + wq 16 + wk 16)
  EXPECT_EQ(net.NumParameters(), 20 + 12 + 2 * 36);
  EXPECT_EQ(net.cells()->at(0)->NumParameters(), 36);
}

TEST(ModuleTest, ParametersRequireGradUnlessFrozen) {
  Module m;
  Var w = m.RegisterParameter("w", Tensor::Zeros({2}, kF32));
  Var frozen = m.RegisterParameter("frozen", Tensor::Zeros({2}, kF32), false);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_FALSE(frozen.requires_grad());
  EXPECT_EQ(m.parameters().size(), 2u);
}

TEST(ModuleTest, RegisteredParameterSharesStorage) {
  Module m;
  Tensor t = Tensor::Zeros({3}, kF32);
  Var w = m.RegisterParameter("w", t);
  t.set(1, 7.0);
  EXPECT_EQ(w.value().at(1), 7.0);
}

TEST(ModuleTest, LookupByDottedName) {
  Net net(4, 2);
  Var wq = net.parameter("cells.1.attn.wq");
  EXPECT_EQ(wq.node(), net.cells()->Get<Cell>(1)->attn()->wq().node());
  EXPECT_TRUE(net.HasParameter("embed"));
  EXPECT_TRUE(net.HasParameter("cells.0.attn.wk"));
  EXPECT_FALSE(net.HasParameter("cells.0.attn.wv"));
  EXPECT_FALSE(net.HasParameter("cells.7.bias"));
  EXPECT_FALSE(net.HasParameter("cells"));  // a module, not a parameter
  EXPECT_TRUE(net.HasSubmodule("cells.1.attn"));
  EXPECT_FALSE(net.HasSubmodule("cells.2"));
  EXPECT_EQ(net.submodule("cells.1.attn")->Name(), "Attention");
}

TEST(ModuleTest, LookupErrorsSayWhatExists) {
  Net net(4, 1);
  EXPECT_ERROR_CONTAINS(net.parameter("cells.0.attn.wv"), "cells.0.attn.wv", "'wq'", "'wk'");
  EXPECT_ERROR_CONTAINS(net.parameter("cells.3.bias"), "cells.3.bias", "'cells'",
                        "no child module '3'", "'0'");
  EXPECT_ERROR_CONTAINS(net.submodule("cells.0.mlp"), "cells.0.mlp", "'cells.0'", "'attn'");
  EXPECT_ERROR_CONTAINS(net.cells()->at(5), "index 5", "1 modules");
  EXPECT_ERROR_CONTAINS(net.cells()->Get<Attention>(0), "Cell");
}

TEST(ModuleTest, RejectsBadAndDuplicateNames) {
  Module m;
  m.RegisterParameter("w", Tensor::Zeros({1}, kF32));
  EXPECT_ERROR_CONTAINS(m.RegisterParameter("w", Tensor::Zeros({1}, kF32)), "'w'",
                        "already a parameter");
  EXPECT_ERROR_CONTAINS(m.RegisterModule("w", std::make_shared<Module>()), "'w'",
                        "already a parameter");
  EXPECT_ERROR_CONTAINS(m.RegisterParameter("a.b", Tensor::Zeros({1}, kF32)), "'a.b'");
  EXPECT_ERROR_CONTAINS(m.RegisterParameter("a b", Tensor::Zeros({1}, kF32)), "'a b'");
  EXPECT_ERROR_CONTAINS(m.RegisterParameter("", Tensor::Zeros({1}, kF32)), "empty");
  EXPECT_ERROR_CONTAINS(m.RegisterParameter("t", Tensor()), "'t'", "empty tensor");
  EXPECT_ERROR_CONTAINS(m.RegisterModule("child", std::shared_ptr<Module>()), "'child'", "null");
  EXPECT_EQ(m.parameters().size(), 1u);
  EXPECT_TRUE(m.children().empty());
}

TEST(ModuleTest, TiedParametersAreListedOnce) {
  auto shared_cell = std::make_shared<Cell>(2);
  Module m;
  m.RegisterModule("first", shared_cell);
  m.RegisterModule("second", shared_cell);
  Var extra = m.RegisterParameter("tied", shared_cell->attn()->wq());
  // Own parameters come first, so the tied weight is listed under "tied" and
  // skipped when the walk reaches it again inside "first".
  const std::vector<std::string> expected = {"tied", "first.bias", "first.attn.wk"};
  EXPECT_EQ(Names(m.named_parameters()), expected);
  EXPECT_EQ(m.NumParameters(), 2 + 4 + 4);
  EXPECT_EQ(m.parameter("second.attn.wq").node(), extra.node());
}

TEST(ModuleTest, TrainAndEvalPropagateToDescendants) {
  Net net(2, 2);
  EXPECT_TRUE(net.is_training());
  EXPECT_TRUE(net.cells()->at(1)->is_training());
  net.Eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.cells()->is_training());
  EXPECT_FALSE(net.cells()->Get<Cell>(0)->attn()->is_training());
  EXPECT_FALSE(net.cells()->Get<Cell>(1)->attn()->is_training());
  // A subtree can be switched on its own.
  net.cells()->at(1)->Train();
  EXPECT_TRUE(net.cells()->Get<Cell>(1)->attn()->is_training());
  EXPECT_FALSE(net.cells()->Get<Cell>(0)->is_training());
  EXPECT_FALSE(net.is_training());
  net.Train(true);
  EXPECT_TRUE(net.cells()->Get<Cell>(0)->attn()->is_training());
}

TEST(ModuleTest, ZeroGradDropsEveryGradient) {
  Net net(2, 2);
  for (const Var& p : net.parameters()) {
    Var handle = p;
    handle.set_grad(Var(Tensor::Ones(p.shape(), p.dtype())));
  }
  for (const Var& p : net.parameters()) ASSERT_TRUE(p.has_grad());
  net.ZeroGrad();
  for (const auto& [name, p] : net.named_parameters()) EXPECT_FALSE(p.has_grad()) << name;
}

TEST(ModuleTest, NamedValuesShareStorage) {
  Net net(2, 1);
  const NamedTensors values = net.NamedValues();
  ASSERT_EQ(values.size(), net.named_parameters().size());
  EXPECT_EQ(values[0].first, "embed");
  EXPECT_TRUE(values[0].second.SameStorage(net.parameter("embed").value()));
}

TEST(ModuleTest, LoadParametersCopiesIntoExistingStorage) {
  Net source(3, 2);
  Net target(3, 2);
  Rng rng(1);
  for (const Var& p : source.parameters()) {
    Var handle = p;
    handle.mutable_value().CopyFrom(RandomNormal(p.shape(), 0.0, 1.0, kF32, rng));
  }
  const Var held = target.parameter("cells.1.attn.wk");  // as an optimizer would hold it
  target.LoadParameters(source.NamedValues());
  for (const auto& [name, p] : source.named_parameters()) {
    EXPECT_EQ(MaxAbsDiff(p.value(), target.parameter(name).value()), 0.0) << name;
    EXPECT_FALSE(p.value().SameStorage(target.parameter(name).value())) << name;
  }
  EXPECT_EQ(MaxAbsDiff(held.value(), source.parameter("cells.1.attn.wk").value()), 0.0);
}

TEST(ModuleTest, LoadParametersConvertsDType) {
  Module m;
  m.RegisterParameter("w", Tensor::Zeros({2}, DType::kFloat64));
  m.LoadParameters({{"w", Tensor::FromVector({2}, {0.5, -1.5}, kF32)}});
  EXPECT_EQ(m.parameter("w").dtype(), DType::kFloat64);
  EXPECT_EQ(m.parameter("w").value().ToVector(), (std::vector<double>{0.5, -1.5}));
}

TEST(ModuleTest, LoadParametersShapeErrorNamesParameterAndBothShapes) {
  Net net(4, 2);
  NamedTensors values;
  for (const auto& [name, t] : net.NamedValues()) values.emplace_back(name, t.Clone());
  values[4].second = Tensor::Zeros({4, 5}, kF32);  // cells.0.attn.wk is [4, 4]
  const Tensor before = net.parameter("embed").value().Clone();
  values[0].second.Fill(9.0);
  EXPECT_ERROR_CONTAINS(net.LoadParameters(values), "'cells.0.attn.wk'", "[4, 4]", "[4, 5]");
  // Nothing was copied, not even the entries before the bad one.
  EXPECT_EQ(MaxAbsDiff(net.parameter("embed").value(), before), 0.0);
}

TEST(ModuleTest, LoadParametersStrictNamesMissingAndUnexpected) {
  Net net(2, 1);
  NamedTensors values = net.NamedValues();
  values.erase(values.begin() + 1);  // drop "head"
  values.emplace_back("cells.0.attn.wv", Tensor::Zeros({2, 2}, kF32));
  EXPECT_ERROR_CONTAINS(net.LoadParameters(values), "missing", "'head'", "unexpected",
                        "'cells.0.attn.wv'");
}

TEST(ModuleTest, LoadParametersNonStrictSkipsUnmatchedNames) {
  Module m;
  m.RegisterParameter("a", Tensor::Zeros({2}, kF32));
  m.RegisterParameter("b", Tensor::Zeros({2}, kF32));
  LoadParametersOptions options;
  options.strict = false;
  m.LoadParameters({{"b", Tensor::Ones({2}, kF32)}, {"zzz", Tensor::Ones({9}, kF32)}}, options);
  EXPECT_EQ(m.parameter("a").value().ToVector(), (std::vector<double>{0, 0}));
  EXPECT_EQ(m.parameter("b").value().ToVector(), (std::vector<double>{1, 1}));
  // Shapes of matching names are still checked.
  EXPECT_ERROR_CONTAINS(m.LoadParameters({{"a", Tensor::Ones({3}, kF32)}}, options), "'a'", "[2]",
                        "[3]");
}

TEST(ModuleTest, LoadParametersRejectsDuplicateSourceNames) {
  Module m;
  m.RegisterParameter("a", Tensor::Zeros({1}, kF32));
  EXPECT_ERROR_CONTAINS(
      m.LoadParameters({{"a", Tensor::Ones({1}, kF32)}, {"a", Tensor::Ones({1}, kF32)}}), "'a'",
      "twice");
}

TEST(ModuleTest, ToStringPrintsTreeWithShapes) {
  Net net(2, 1);
  Var frozen =
      net.cells()->at(0)->RegisterParameter("scale", Tensor::Ones({}, DType::kFloat64), false);
  std::ostringstream out;
  out << net;
  const std::string expected =
      "Net (27 parameters)\n"
      "  embed: float32 [5, 2]\n"
      "  head: float32 [2, 3]\n"
      "  cells: ModuleList (11 parameters)\n"
      "    0: Cell (11 parameters)\n"
      "      bias: float32 [2]\n"
      "      scale: float64 [] (frozen)\n"
      "      attn: Attention (8 parameters)\n"
      "        wq: float32 [2, 2]\n"
      "        wk: float32 [2, 2]\n";
  EXPECT_EQ(out.str(), expected);
  EXPECT_EQ(net.ToString(), expected);
}

TEST(ModuleTest, ToStringMarksSharedModules) {
  auto cell = std::make_shared<Cell>(1);
  Module m;
  m.RegisterModule("a", cell);
  m.RegisterModule("b", cell);
  const std::string text = m.ToString();
  EXPECT_NE(text.find("  b: Cell (shared with 'a')\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace stillpoint::module_test
