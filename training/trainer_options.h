// The trainer's settings, each struct declaring its fields once
// (framework/option_fields.h): the config keys train.*, eval.* and log.*
// (except train.optimizer.* and train.schedule.*, training/optimizer.h and
// schedule.h) are made from these declarations (training/config_schema.cc)
// and read back by FromConfig.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/option_fields.h"
#include "training/config/config.h"

namespace stillpoint {

// train.*
struct TrainerOptions {
  int64_t steps = 300;
  int64_t batch_size = 32;
  int64_t shards = 1;
  double clip_norm = 1.0;
  int64_t pretrain_steps = 0;
  int64_t eval_every = 50;
  int64_t checkpoint_every = 100;
  int64_t log_every = 10;
  std::string on_nonfinite = "skip";    // skip | stop
  int64_t max_skipped_steps = 20;
  std::string on_unconverged = "warn";  // ignore | warn | stop
  // Bansal et al.'s progressive loss (tied and implicit models):
  // L = (1 - weight) L(model) + weight L(n + k), where L(n + k) is the loss
  // after n cell steps from z0 = 0 run without gradient (n uniform in
  // [0, N - k), N = progressive_loss_iterations, 0: model.unroll_steps)
  // and k = progressive_loss_steps more with gradient. weight 0: off.
  double progressive_loss_weight = 0.0;
  int64_t progressive_loss_steps = 1;
  int64_t progressive_loss_iterations = 0;

  static const OptionFields<TrainerOptions>& Fields();
  static TrainerOptions FromConfig(const Config& config);
};

// eval.*
struct EvalOptions {
  int64_t batch_size = 256;
  int64_t max_examples = 0;  // 0: the whole held-out set
  int64_t gradient_check_batch_size = 8;
  int64_t max_iterations = 0;
  double iterations_per_token = 0;  // 0: the trained iterations per training token
  std::vector<double> iterations_sweep;
  std::vector<double> lengths;
  std::vector<double> sizes;

  static const OptionFields<EvalOptions>& Fields();
  static EvalOptions FromConfig(const Config& config);
};

// log.*
struct LogOptions {
  std::string dir;
  std::vector<std::string> formats = {"csv", "jsonl"};
  std::string progress = "auto";  // auto | bar | lines | none
  bool plots = true;

  static const OptionFields<LogOptions>& Fields();
  static LogOptions FromConfig(const Config& config);
};

// model.regularization.*: the regularisers of implicit models added to the
// training loss: the Jacobian and spectral-radius penalties (implicit and
// energy models), the fixed-point correction loss (implicit models) and the
// spectral-radius penalty of the cells' energy attentions (explicit, tied
// and implicit models with model.attention an energy block);
// solvers/regularizers.h. The struct's defaults are all off; a config's
// defaults follow model.kind (ImplicitModelRegularization).
struct RegularizationOptions {
  double jacobian_weight = 0.0;
  int64_t jacobian_probes = 1;
  double jacobian_frequency = 1.0;
  int64_t jacobian_ramp_steps = 0;
  double spectral_radius_weight = 0.0;
  double spectral_radius_target = 0.8;
  int64_t spectral_radius_iterations = 10;
  double spectral_radius_frequency = 1.0;
  int64_t spectral_radius_samples = 0;  // 0: every sample of the batch
  std::string spectral_radius_rows = "random";  // random | slowest
  double attention_spectral_radius_weight = 0.0;
  double attention_spectral_radius_target = 0.8;
  int64_t attention_spectral_radius_iterations = 10;
  double correction_weight = 0.0;
  int64_t correction_iterates = 2;
  int64_t correction_steps = 1;
  double correction_tau = 1.0;
  double correction_gamma = 0.8;

  static const OptionFields<RegularizationOptions>& Fields();
  static RegularizationOptions FromConfig(const Config& config);
};

// Whether the key model.regularization.<field> takes effect for a model of
// `kind` whose cells' attention is `attention`: the attention_* keys with an
// energy attention inside the cells (every kind but energy), the
// correction_* keys for implicit models (the loss is taken on a cell's
// iterates), the others for implicit and energy models (a fixed point of
// the model's own). A key that does not is refused when set away from its
// default (CheckTrainingConfig), and `compare` sets it back for the
// variants it does not fit.
bool RegularizationKeyApplies(const std::string& field, const std::string& kind,
                              const std::string& attention);

// The regularisation a config's model.kind implicit gets by default: the
// spectral-radius penalty with weight 100 towards 0.5, on a quarter of the
// steps, its direction from 5 Arnoldi steps. Without it the quickstart's
// implicit cells train to a radius of 0.84-0.85 with the spectrum spread
// near that circle, where 20 Anderson adjoint iterations meet 1e-4 for 45%
// of the samples; with it, 0.70-0.80 and every adjoint converges (docs/
// solvers.md, "Measured: stable equilibria and the exact gradient"). The
// keys as name -> value text.
const std::vector<std::pair<std::string, std::string>>& ImplicitModelRegularization();

}  // namespace stillpoint
