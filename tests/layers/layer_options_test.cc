// The layers' Options structs that declare their fields
// (framework/option_fields.h): each default is valid, a value just outside
// each bound is refused with a message naming the field, building a layer
// with it throws an Error naming the field, and ToString prints every member.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "framework/check.h"
#include "framework/random.h"
#include "layers/attention.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/energy_attention.h"
#include "layers/energy_layer.h"
#include "layers/energy_transformer.h"
#include "layers/expfam_attention.h"
#include "layers/hopfield.h"
#include "layers/implicit_layer.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/probabilistic_attention.h"

namespace stillpoint::layer_options_test {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

template <typename Options>
void ExpectValid(const Options& options) {
  std::string error;
  EXPECT_TRUE(options.IsValid(&error)) << error;
  EXPECT_TRUE(error.empty()) << error;
}

// IsValid refuses `options` with a message naming `field` and `type`.
template <typename Options>
void ExpectRefused(const Options& options, const std::string& field, const std::string& type) {
  std::string error;
  EXPECT_FALSE(options.IsValid(&error)) << field;
  EXPECT_NE(error.find(field), std::string::npos) << error;
  EXPECT_NE(error.find(type), std::string::npos) << error;
}

// `build` throws an Error whose message names `field`.
template <typename Build>
void ExpectBuildThrows(Build build, const std::string& field) {
  try {
    build();
    ADD_FAILURE() << "no Error for " << field;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
  }
}

// ToString has one "name: value" line for each of `names` (the struct's
// members, written out here so a member missing from Fields() shows).
template <typename Options>
void ExpectNamesEveryField(const Options& options, const std::vector<std::string>& names) {
  const std::string text = "\n" + options.ToString();
  for (const std::string& name : names) {
    EXPECT_NE(text.find("\n" + name + ": "), std::string::npos) << name << " in\n" << text;
  }
  EXPECT_EQ(Options::Fields().fields().size(), names.size()) << text;
}

TEST(LayerOptionsTest, HopfieldOptions) {
  const HopfieldOptions defaults;
  ExpectValid(defaults);
  for (const char* field : {"state_size", "heads"}) {
    HopfieldOptions o;
    (std::string(field) == "heads" ? o.heads : o.state_size) = 0;
    ExpectRefused(o, field, "HopfieldOptions");
  }
  HopfieldOptions o;
  o.stored_size = -1;
  ExpectRefused(o, "stored_size", "HopfieldOptions");
  o = {};
  o.value_size = -1;
  ExpectRefused(o, "value_size", "HopfieldOptions");
  o = {};
  o.head_dim = -1;
  ExpectRefused(o, "head_dim", "HopfieldOptions");
  o = {};
  o.value_head_dim = -1;
  ExpectRefused(o, "value_head_dim", "HopfieldOptions");
  o = {};
  o.output_size = -1;
  ExpectRefused(o, "output_size", "HopfieldOptions");
  o = {};
  o.beta = -1e-9;
  ExpectRefused(o, "beta", "HopfieldOptions");
  o = {};
  o.solve.steps = -1;
  ExpectRefused(o, "solve.steps", "HopfieldOptions");
  // state_size must divide by heads only when head_dim is derived from it.
  o = {};
  o.state_size = 10;
  o.heads = 3;
  ExpectRefused(o, "multiple of heads", "HopfieldOptions");
  o.head_dim = 4;
  ExpectValid(o);

  Rng rng(1);
  HopfieldOptions bad;
  bad.beta = -1.0;
  ExpectBuildThrows([&] { HopfieldAttention layer(bad, rng); }, "beta");
  bad = {};
  bad.solve.steps = -2;
  ExpectBuildThrows([&] { HopfieldPooling layer(bad, 2, rng); }, "solve.steps");

  ExpectNamesEveryField(
      defaults, {"state_size", "stored_size", "value_size", "heads", "head_dim", "value_head_dim",
                 "output_size", "beta", "learn_beta", "normalize_stored", "normalize_state",
                 "projection_bias", "causal", "energy_constants", "query_field", "contraction", "solve.mode",
                 "solve.steps", "solve.trace_energy", "dtype"});
}

TEST(LayerOptionsTest, ValueBeliefOptions) {
  const ValueBeliefOptions defaults;
  ExpectValid(defaults);
  ValueBeliefOptions o;
  o.iterations = -1;
  ExpectRefused(o, "iterations", "ValueBeliefOptions");
  o = {};
  o.value_prior_precision = -1e-9;
  ExpectRefused(o, "value_prior_precision", "ValueBeliefOptions");
  o.value_prior_precision = kInfinity;  // frozen values
  ExpectValid(o);
  o = {};
  o.precision_prior_shape = 0.999;
  ExpectRefused(o, "precision_prior_shape", "ValueBeliefOptions");
  o = {};
  o.precision_prior_rate = -1e-9;
  ExpectRefused(o, "precision_prior_rate", "ValueBeliefOptions");
  o = {};
  o.mixing_concentration = 0.999;
  ExpectRefused(o, "mixing_concentration", "ValueBeliefOptions");
  ExpectNamesEveryField(defaults, {"iterations", "value_prior_precision", "adapt_value_precision",
                                   "precision_prior_shape", "precision_prior_rate", "adapt_mixing",
                                   "mixing_concentration"});
}

TEST(LayerOptionsTest, ProbabilisticAttentionOptions) {
  const ProbabilisticAttentionOptions defaults;
  ExpectValid(defaults);
  ProbabilisticAttentionOptions o;
  o.dim = 0;
  ExpectRefused(o, "dim", "ProbabilisticAttentionOptions");
  o = {};
  o.heads = 0;
  ExpectRefused(o, "heads", "ProbabilisticAttentionOptions");
  o = {};
  o.head_dim = -1;
  ExpectRefused(o, "head_dim", "ProbabilisticAttentionOptions");
  o = {};
  o.value_head_dim = -1;
  ExpectRefused(o, "value_head_dim", "ProbabilisticAttentionOptions");
  o = {};
  o.query_precision = -1e-9;
  ExpectRefused(o, "query_precision", "ProbabilisticAttentionOptions");
  o = {};
  o.value_precision = -1e-9;
  ExpectRefused(o, "value_precision", "ProbabilisticAttentionOptions");
  o = {};
  o.solve.steps = -1;
  ExpectRefused(o, "solve.steps", "ProbabilisticAttentionOptions");
  o = {};
  o.dim = 10;
  o.heads = 3;
  ExpectRefused(o, "multiple of heads", "ProbabilisticAttentionOptions");
  // The nested options: checked by their own IsValid, +infinity included.
  o = {};
  o.key_adaptation.precision_prior_shape = 0.5;
  ExpectRefused(o, "key_adaptation: KeyAdaptationOptions: precision_prior_shape",
                "ProbabilisticAttentionOptions");
  o = {};
  o.value_belief.mixing_concentration = 0.5;
  ExpectRefused(o, "value_belief: ValueBeliefOptions: mixing_concentration",
                "ProbabilisticAttentionOptions");
  o = {};
  o.key_adaptation.key_prior_precision = kInfinity;
  o.value_belief.value_prior_precision = kInfinity;
  ExpectValid(o);

  Rng rng(2);
  ProbabilisticAttentionOptions bad;
  bad.value_precision = -0.5;
  ExpectBuildThrows([&] { ProbabilisticAttention layer(bad, rng); }, "value_precision");

  ExpectNamesEveryField(
      defaults,
      {"dim", "heads", "head_dim", "value_head_dim", "query_precision", "value_precision",
       "learn_precisions", "contraction", "magnitude_prior", "log_normalizer", "causal", "projection_bias",
       "solve.mode", "solve.steps", "solve.trace_energy", "key_adaptation.iterations",
       "key_adaptation.prior_precision", "key_adaptation.recentre_prior",
       "key_adaptation.adapt_precision", "key_adaptation.precision_prior_shape",
       "key_adaptation.precision_prior_rate", "value_belief.iterations",
       "value_belief.value_prior_precision", "value_belief.adapt_value_precision",
       "value_belief.precision_prior_shape", "value_belief.precision_prior_rate",
       "value_belief.adapt_mixing", "value_belief.mixing_concentration", "force_clamped_output",
       "dtype"});
}

TEST(LayerOptionsTest, ExpFamAttentionOptions) {
  const ExpFamAttentionOptions defaults;
  ExpectValid(defaults);
  ExpFamAttentionOptions o;
  o.dim = 0;
  ExpectRefused(o, "dim", "ExpFamAttentionOptions");
  o = {};
  o.heads = 0;
  ExpectRefused(o, "heads", "ExpFamAttentionOptions");
  o = {};
  o.beta = 0.0;
  ExpectRefused(o, "beta", "ExpFamAttentionOptions");
  o = {};
  o.layer_norm_eps = -1e-12;
  ExpectRefused(o, "layer_norm_eps", "ExpFamAttentionOptions");
  o = {};
  o.solve.steps = -1;
  ExpectRefused(o, "solve.steps", "ExpFamAttentionOptions");
  o = {};
  o.dim = 10;
  o.heads = 3;
  ExpectRefused(o, "multiple of heads", "ExpFamAttentionOptions");
  o = {};
  o.query_field = true;
  ExpectRefused(o, "query_field", "ExpFamAttentionOptions");
  o.update = ExpFamUpdate::kCccp;
  ExpectValid(o);
  // components is read by the mixture measure only, beta by the discrete
  // one: an unread value stays accepted, a read one is checked.
  o = {};
  o.components = 0;
  ExpectValid(o);
  o.measure = ExpFamMeasure::kMixture;
  ExpectRefused(o, "components", "ExpFamAttentionOptions");
  o = {};
  o.measure = ExpFamMeasure::kGaussian;
  o.beta = -1.0;
  ExpectValid(o);
  // contraction (discrete measure only) lies in [0, 1).
  o = {};
  o.contraction = 1.0;
  ExpectRefused(o, "contraction", "ExpFamAttentionOptions");
  o.measure = ExpFamMeasure::kMixture;
  ExpectValid(o);

  Rng rng(3);
  ExpFamAttentionOptions bad;
  bad.measure = ExpFamMeasure::kMixture;
  bad.components = 0;
  ExpectBuildThrows([&] { ExpFamAttention layer(bad, rng); }, "components");

  ExpectNamesEveryField(defaults, {"measure", "dim", "heads", "components", "beta", "learn_beta",
                                   "project_patterns", "contraction", "update", "query_field",
                                   "layer_norm",
                                   "layer_norm_eps", "layer_norm_affine", "solve.mode",
                                   "solve.steps", "solve.trace_energy", "dtype"});
}

TEST(LayerOptionsTest, EnergyTransformerOptions) {
  const EnergyTransformerOptions defaults;
  ExpectValid(defaults);
  const auto refused = [](auto change, const std::string& field) {
    EnergyTransformerOptions o;
    change(o);
    ExpectRefused(o, field, "EnergyTransformerOptions");
  };
  refused([](EnergyTransformerOptions& o) { o.dim = 0; }, "dim");
  refused([](EnergyTransformerOptions& o) { o.heads = 0; }, "heads");
  refused([](EnergyTransformerOptions& o) { o.head_dim = 0; }, "head_dim");
  refused([](EnergyTransformerOptions& o) { o.memories = 0; }, "memories");
  refused([](EnergyTransformerOptions& o) { o.memory_beta = 0.0; }, "memory_beta");
  refused([](EnergyTransformerOptions& o) { o.beta = -1e-9; }, "beta");
  refused([](EnergyTransformerOptions& o) { o.step = 0.0; }, "step");
  refused([](EnergyTransformerOptions& o) { o.layer_norm_eps = -1e-12; }, "layer_norm_eps");
  refused([](EnergyTransformerOptions& o) { o.weight_std = -1e-9; }, "weight_std");
  refused([](EnergyTransformerOptions& o) { o.memory_std = -1e-9; }, "memory_std");
  refused([](EnergyTransformerOptions& o) { o.solve.steps = -1; }, "solve.steps");

  Rng rng(4);
  EnergyTransformerOptions bad;
  bad.step = 0.0;
  ExpectBuildThrows([&] { EnergyTransformerBlock layer(bad, rng); }, "step");

  ExpectNamesEveryField(
      defaults, {"dim", "heads", "head_dim", "memories", "memory", "memory_beta", "beta",
                 "learn_beta", "exclude_self", "causal", "key_grad", "dynamics", "step",
                 "layer_norm_eps", "weight_std", "memory_std", "solve.mode", "solve.steps",
                 "solve.trace_energy", "dtype"});
}

TEST(LayerOptionsTest, EnergyAttentionOptions) {
  const EnergyAttentionOptions defaults;
  ExpectValid(defaults);
  EnergyAttentionOptions o;
  o.block.beta = -1.0;
  ExpectRefused(o, "block: EnergyBlockOptions: beta", "EnergyAttentionOptions");
  o = {};
  o.solver.backward.warm_start = true;
  ExpectRefused(o, "warm-started", "EnergyAttentionOptions");

  Rng rng(5);
  ExpectBuildThrows([&] { EnergyAttention layer(o, rng); }, "warm-started");

  // solver (ImplicitOptions) declares no fields; the block's are all printed.
  const std::string text = defaults.ToString();
  for (const auto& field : EnergyBlockOptions::Fields().fields()) {
    EXPECT_NE(text.find("block." + field.name + ": "), std::string::npos) << field.name;
  }
}

TEST(LayerOptionsTest, EnergySolveAndTraceOptions) {
  ExpectValid(EnergySolveOptions());
  EnergySolveOptions solve;
  solve.steps = -1;
  ExpectRefused(solve, "steps", "EnergySolveOptions");
  ExpectNamesEveryField(EnergySolveOptions(), {"mode", "steps", "trace_energy"});

  ExpectValid(EnergyTraceOptions());
  EnergyTraceOptions trace;
  trace.max_steps = -1;
  ExpectRefused(trace, "max_steps", "EnergyTraceOptions");
  trace = {};
  trace.tolerance = -1e-12;
  ExpectRefused(trace, "tolerance", "EnergyTraceOptions");
  trace.tolerance = kInfinity;  // accepted, as before: stops after one update
  ExpectValid(trace);
  ExpectNamesEveryField(EnergyTraceOptions(), {"max_steps", "tolerance"});
}

TEST(LayerOptionsTest, BuildingBlockOptions) {
  ExpectValid(AttentionOptions());
  AttentionOptions attention;
  attention.scale = -1e-9;
  ExpectRefused(attention, "scale", "AttentionOptions");
  Rng rng(6);
  ExpectBuildThrows([&] { MultiHeadAttention layer(8, 2, rng, attention); }, "scale");
  ExpectNamesEveryField(AttentionOptions(), {"causal", "scale", "bias", "dtype"});

  ExpectValid(DropoutOptions());
  DropoutOptions dropout;
  dropout.p = 1.0;  // [0, 1): 1 would divide by 0
  ExpectRefused(dropout, "p = 1", "DropoutOptions");
  ExpectBuildThrows([&] { Dropout layer(dropout); }, "p = 1");
  dropout.p = -1e-9;
  ExpectRefused(dropout, "p = ", "DropoutOptions");
  dropout.p = 0.0;
  ExpectValid(dropout);
  ExpectNamesEveryField(DropoutOptions(), {"p", "seed"});

  ExpectValid(LayerNormOptions());
  LayerNormOptions norm;
  norm.eps = -1e-12;
  ExpectRefused(norm, "eps", "LayerNormOptions");
  ExpectBuildThrows([&] { LayerNorm layer(4, norm); }, "eps");
  norm.eps = 0.0;  // exact normalisation
  ExpectValid(norm);
  ExpectNamesEveryField(LayerNormOptions(), {"eps", "elementwise_affine", "dtype"});

  ExpectValid(LinearOptions());
  ExpectNamesEveryField(LinearOptions(), {"bias", "dtype"});

  ExpectValid(EmbeddingOptions());
  EmbeddingOptions embedding;
  embedding.init_std = -1e-9;
  ExpectRefused(embedding, "init_std", "EmbeddingOptions");
  ExpectBuildThrows([&] { TokenEmbedding layer(5, 4, rng, embedding); }, "init_std");
  ExpectBuildThrows([&] { PositionalEmbedding layer(5, 4, rng, embedding); }, "init_std");
  ExpectNamesEveryField(EmbeddingOptions(), {"init_std", "dtype"});

  ExpectValid(EnergyImplicitOptions());
  ExpectNamesEveryField(EnergyImplicitOptions(), {"trace_energy"});
}

}  // namespace
}  // namespace stillpoint::layer_options_test
