// A user's own energy attention, registered under a name in this program and
// trained from a YAML config (model.energy.layer: lse_attention), with the
// library's config loader and trainer. Usage: train_lse_attention CONFIG
// [key.path=value ...]; exit 0 when the run's held-out accuracy is at least
// twice chance (2 / task.vocab_size): the layer learned.
#include <iostream>

#include "framework/ops.h"
#include "layers/energy_block.h"
#include "layers/linear.h"
#include "training/config_schema.h"
#include "training/experiment.h"
#include "training/trainer.h"

namespace sp = stillpoint;

// E(Z) = sum_t ( |z_t|^2 / 2 - lse_s(beta k_s . z_t) / beta ): one energy
// per sample ([B], as EnergyLayer requires); z [B, T, d], keys [B, S, d].
// Its gradient step of size 1 is z_t <- K^T softmax(beta K z_t): attention.
class LseAttentionEnergy : public sp::EnergyLayer {
 public:
  explicit LseAttentionEnergy(sp::DType dtype) {
    set_gradient_step(1.0);
    beta_ = RegisterParameter("beta", sp::Tensor::Full({1}, 4.0, dtype));
  }
  std::string Name() const override { return "LseAttentionEnergy"; }
  sp::Var Energy(const sp::Var& z, const sp::EnergyContext& ctx) const override {
    const sp::Var scores = sp::matmul(z, ctx.Get("keys"), false, true);  // [B, T, S]
    const sp::Var lse = sp::logsumexp(scores * beta_) / beta_;           // [B, T]
    return sp::sum(sp::sum(sp::square(z), 2) * 0.5 - lse, 1);          // [B]
  }

 private:
  sp::Var beta_;
};

// The block around it: keys projected from the tokens u, the state starting
// at u, and an output projection of the solved state.
class LseAttentionBlock : public sp::EnergyBlock {
 public:
  LseAttentionBlock(const sp::EnergyBlockOptions& o, sp::Rng& rng) {
    keys_ = RegisterModule("keys", std::make_shared<sp::Linear>(
                                       o.dim, o.dim, rng, sp::LinearOptions{false, o.dtype}));
    out_ = RegisterModule("out", std::make_shared<sp::Linear>(o.dim, o.dim, rng,
                                                              sp::LinearOptions{true, o.dtype}));
    layer_ = RegisterModule("layer", std::shared_ptr<sp::EnergyLayer>(
                                         std::make_shared<LseAttentionEnergy>(o.dtype)));
  }
  std::string Name() const override { return "LseAttentionBlock"; }
  const std::shared_ptr<sp::EnergyLayer>& layer() const override { return layer_; }
  sp::EnergyBlockProblem Prepare(const sp::Var& u) const override {
    sp::EnergyBlockProblem problem;
    problem.context.Set("keys", Project(*keys_, u));
    problem.initial_state = u;
    problem.injection = u;
    return problem;
  }
  sp::Var Output(const sp::Var& state, const sp::EnergyBlockProblem&) const override {
    return Project(*out_, state);
  }

 private:
  // A Linear applied to every token of [B, T, d].
  static sp::Var Project(const sp::Linear& linear, const sp::Var& x) {
    const sp::Var rows = sp::reshape(x, {x.dim(0) * x.dim(1), x.dim(2)});
    return sp::reshape(linear.Forward(rows), {x.dim(0), x.dim(1), x.dim(2)});
  }
  std::shared_ptr<sp::Linear> keys_, out_;
  std::shared_ptr<sp::EnergyLayer> layer_;
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
    const sp::Config config = sp::Config::FromFile(
        sp::StillpointSchema(), argv[1], std::vector<std::string>(argv + 2, argv + argc));
    sp::Experiment experiment = sp::BuildExperiment(config, argv[1]);
    sp::TrainOptions options;
    options.progress = &std::cout;
    options.overwrite = true;
    const sp::TrainSummary summary = sp::Train(experiment, options);
    std::cout << summary.BriefReport() << "\n";
    const double chance = 1.0 / static_cast<double>(config.GetInt("task.vocab_size"));
    return summary.final_eval.accuracy >= 2 * chance ? 0 : 1;
  } catch (const sp::ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
