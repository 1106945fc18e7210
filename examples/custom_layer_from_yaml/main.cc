// A user's own energy attention, registered under a name in this program and
// trained from a YAML config (model.energy.layer: lse_attention), with the
// library's config loader and trainer. Usage: train_lse_attention CONFIG
// [key.path=value ...]; exit 0 when the run's held-out accuracy is at least
// 90%: the layer learned the task.
#include <iostream>

#include "framework/ops.h"
#include "layers/energy_block.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/trainer.h"

namespace sp = stillpoint;

// What the energy reads besides the state, each member per sample (axis 0
// is the sample, so the solver can select the samples still iterating).
struct LseAttentionContext {
  sp::Var queries;  // [B, T, d]: an external field on the state
  sp::Var keys;     // [B, S, d]
  static const sp::ContextFields<LseAttentionContext>& Fields() {
    using C = LseAttentionContext;
    static const auto fields = sp::ContextFields<C>("LseAttentionContext")
                                   .PerSample("queries", &C::queries)
                                   .PerSample("keys", &C::keys);
    return fields;
  }
};

// E(Z) = sum_t ( |z_t|^2 / 2 - q_t . z_t - lse_s(beta k_s . z_t) / beta ):
// one energy per sample ([B], as EnergyLayer requires); z [B, T, d]. Its
// gradient step of size 1 is z_t <- q_t + K^T softmax(beta K z_t):
// attention, with the query as a field that keeps the fixed point a
// function of the query (without it, only through where the solve starts).
class LseAttentionEnergy : public sp::EnergyLayer<LseAttentionContext> {
 public:
  explicit LseAttentionEnergy(sp::DType dtype) {
    set_gradient_step(1.0);
    beta_ = RegisterParameter("beta", sp::Tensor::Full({1}, 0.25, dtype));
  }
  std::string Name() const override { return "LseAttentionEnergy"; }
  const sp::Var& beta() const { return beta_; }
  sp::Var Energy(const sp::Var& z, const LseAttentionContext& ctx) const override {
    const sp::Var scores = sp::matmul(z, ctx.keys, false, true);       // [B, T, S]
    const sp::Var lse = sp::logsumexp(scores * beta_) / beta_;         // [B, T]
    const sp::Var field = sp::sum(z * ctx.queries, 2);                 // [B, T]
    return sp::sum(sp::sum(sp::square(z), 2) * 0.5 - field - lse, 1);  // [B]
  }

 private:
  sp::Var beta_;
};

// What the block's Output reads besides the state and the context.
struct LseAttentionExtras {
  sp::Var values;  // [B, T, d]
};

// The block around it: the tokens u normalised (x = LN(u), so the energy's
// scale does not depend on the embedding's), queries and keys projected from
// x, the state starting at x, and as output the attention the solved state
// pays to the keys, applied to values of x, through an output projection.
// EnergyBlockOf registers the energy as the child "layer" and hands Output
// the Problem that MakeProblem built.
class LseAttentionBlock : public sp::EnergyBlockOf<LseAttentionEnergy, LseAttentionExtras> {
 public:
  LseAttentionBlock(const sp::EnergyBlockOptions& o, sp::Rng& rng)
      : EnergyBlockOf(std::make_shared<LseAttentionEnergy>(o.dtype)) {
    norm_ = RegisterModule(
        "norm", std::make_shared<sp::LayerNorm>(o.dim, sp::LayerNormOptions{.dtype = o.dtype}));
    queries_ = RegisterModule("queries", std::make_shared<sp::Linear>(
                                             o.dim, o.dim, rng, sp::LinearOptions{false, o.dtype}));
    keys_ = RegisterModule(
        "keys", std::make_shared<sp::Linear>(o.dim, o.dim, rng, sp::LinearOptions{false, o.dtype}));
    values_ = RegisterModule("values", std::make_shared<sp::Linear>(
                                           o.dim, o.dim, rng, sp::LinearOptions{false, o.dtype}));
    out_ = RegisterModule(
        "out", std::make_shared<sp::Linear>(o.dim, o.dim, rng, sp::LinearOptions{true, o.dtype}));
  }
  std::string Name() const override { return "LseAttentionBlock"; }

 protected:
  Problem MakeProblem(const sp::Var& u, bool /*with_initial_state*/) const override {
    Problem problem;
    const sp::Var x = norm_->Forward(u);
    problem.context.queries = Project(*queries_, x);
    problem.context.keys = Project(*keys_, x);
    problem.extras.values = Project(*values_, x);
    problem.initial_state = x;
    problem.injection = u;
    return problem;
  }
  sp::Var Output(const sp::Var& state, const Problem& problem) const override {
    const sp::Var scores = sp::matmul(state, problem.context.keys, false, true);
    const sp::Var weights = sp::softmax(scores * typed_->beta());  // [B, T, S]
    return Project(*out_, sp::matmul(weights, problem.extras.values));
  }

 private:
  // A Linear applied to every token of [B, T, d].
  static sp::Var Project(const sp::Linear& linear, const sp::Var& x) {
    const sp::Var rows = sp::reshape(x, {x.dim(0) * x.dim(1), x.dim(2)});
    return sp::reshape(linear.Forward(rows), {x.dim(0), x.dim(1), x.dim(2)});
  }
  std::shared_ptr<sp::LayerNorm> norm_;
  std::shared_ptr<sp::Linear> queries_, keys_, values_, out_;
};

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: train_lse_attention CONFIG [key.path=value ...]\n";
    return 2;
  }
  // Registered before the config is read: the config checks
  // model.energy.layer against the registry's names.
  sp::EnergyBlockRegistry().Register(
      "lse_attention",
      [](const sp::EnergyBlockOptions& o, sp::Rng& rng) -> std::shared_ptr<sp::EnergyBlock> {
        return std::make_shared<LseAttentionBlock>(o, rng);
      },
      "log-sum-exp attention energy (examples/custom_layer_from_yaml)");
  try {
    const sp::Config config = sp::Config::FromFile(sp::StillpointSchema(), argv[1],
                                                   std::vector<std::string>(argv + 2, argv + argc));
    sp::Experiment experiment = sp::BuildExperiment(config, argv[1]);
    sp::TrainOptions options;
    options.progress = &std::cout;
    options.overwrite = true;
    const sp::TrainSummary summary = sp::Train(experiment, options);
    std::cout << summary.BriefReport() << "\n";
    return summary.final_eval.accuracy >= 0.9 ? 0 : 1;
  } catch (const sp::ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
