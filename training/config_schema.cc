#include "training/config_schema.h"

#include <algorithm>
#include <limits>

#include "layers/energy_attention.h"
#include "layers/energy_block.h"
#include "layers/registry.h"
#include "training/dataset.h"
#include "training/dataset_registry.h"
#include "training/option_schema.h"
#include "training/trainer_options.h"

namespace stillpoint {
namespace {

constexpr double kInf = std::numeric_limits<double>::max();
constexpr int64_t kBig = int64_t{1} << 40;

template <typename Enum>
std::vector<std::string> Names(const std::vector<Enum>& values) {
  std::vector<std::string> names;
  for (Enum v : values) names.push_back(ToString(v));
  return names;
}

// Whether a solver key exists under prefix: the inner solve of an energy
// attention has no warm start (one call site serves every evaluation of the
// cell, so there is no previous solution of the same problem) and no
// divergence break (its maps are the catalogue's bounded EM/CCCP updates).
bool SolverKeyApplies(const std::string& prefix, const std::string& key) {
  if (prefix != "model.attention_solver.") return true;
  return key != "backward.warm_start" && key != "forward.divergence_factor";
}

// The keys of an implicit solve under prefix ("model.solver." or
// "model.attention_solver."), with the defaults of `defaults`.
void AddSolverKeys(ConfigSchema& s, const std::string& prefix, const ImplicitOptions& defaults) {
  // ---- PREFIX.forward: ForwardSolverOptions
  AddOptionKeys(s, prefix + "forward.", ForwardSolverOptions::Fields(), defaults.forward,
                [&](const std::string& name) { return SolverKeyApplies(prefix, "forward." + name); });
  // ---- PREFIX.backward: BackwardOptions
  AddOptionKeys(s, prefix + "backward.", BackwardOptions::Fields(), defaults.backward,
                [&](const std::string& name) { return SolverKeyApplies(prefix, "backward." + name); });
}

ConfigSchema BuildSchema() {
  const OptimizerOptions o;
  const ModelOptions m;
  ConfigSchema s;
  s.Int("seed", 0, "Seed of parameter initialisation, data generation and data order", 0, kBig)
      .Int("threads", 2, "Worker threads for every parallel loop (results are bitwise "
                         "reproducible for a given count)", 1, 256)
      .Enum("dtype", "float32", {"float32", "float64"}, "Number type of parameters and states");

  // ---- task
  s.Enum("task.kind", "reverse", DatasetRegistry().Names(),
         "The dataset (DatasetRegistry, training/dataset_registry.h): a synthetic sequence task, "
         "the 8x8 digits images, or a CSV file")
      .Int("task.length", 16, "Tokens per training sequence (sequence tasks and csv)", 2, 4096)
      .Int("task.vocab_size", 16, "Symbols of a sequence task (prefix_parity always uses 2)", 2,
           1 << 20)
      .Int("task.train_examples", 4096, "Training sequences generated (sequence tasks)", 1,
           1 << 24)
      .Int("task.test_examples", 512, "Held-out sequences generated with another seed", 1,
           1 << 24)
      .String("task.path", "",
              "digits: the CSV (default: the shipped examples/data/digits.csv.gz); csv: the "
              "training file. Relative paths are relative to the config file")
      .String("task.test_path", "", "csv: the held-out file")
      .Double("task.test_fraction", 0.2, "digits: fraction held out for testing", 0.01, 0.99)
      .Int("task.feature_dim", 0, "csv: numbers per token (0: the inputs are token ids)", 0,
           1 << 20)
      .Int("task.num_classes", 0, "csv: number of target classes", 0, 1 << 20);

  // ---- model
  s.Enum("model.kind", "implicit", {"explicit", "tied", "implicit", "energy"},
         "explicit: num_layers untied cells; tied: one cell unrolled unroll_steps times with "
         "backprop; implicit: the cell solved to its fixed point; energy: an energy attention "
         "block (model.energy.*) solved to its fixed point, then a feed-forward sublayer")
      .String("model.cell", m.cell, "Registered cell name (explicit, tied, implicit)")
      .String("model.attention", m.cell_options.attention,
              "The cell's attention sublayer: softmax, or a registered energy attention "
              "(built-in: hopfield, probabilistic, expfam, energy_transformer) read at the fixed "
              "point of its energy, solved by model.attention_solver.* (nested in the outer "
              "solve of an implicit model); energy kind: the block (instead of "
              "model.energy.layer)")
      .Int("model.dim", m.dim, "Model width d", 1, 1 << 16)
      .Int("model.heads", m.cell_options.heads,
           "Attention heads of the cell or of the energy block (dim must be a multiple)", 1, 1024)
      .Int("model.hidden", m.cell_options.hidden,
           "Hidden width of the feed-forward block (the cell's, or the energy model's FFN)", 1,
           1 << 20)
      .Int("model.max_length", 64, "Longest sequence the positional table covers (>= every "
                                   "training and evaluation length)", 1, 1 << 20)
      .Int("model.num_layers", m.num_layers, "explicit: number of untied cells", 1, 1024)
      .Int("model.unroll_steps", m.unroll_steps,
           "tied: applications of the one cell; implicit/energy: steps of the tied unroll "
           "during train.pretrain_steps",
           1, 4096)
      .Double("model.dropout", 0.0, "Dropout inside the cell (masks frozen per solve)", 0.0, 0.99)
      .String("model.init_from", "",
              "Initial parameters from a .safetensors or .npz file (stillpoint export), matched "
              "by name; every parameter must be present, with its shape (a path relative to the "
              "config file); empty: the random initialisation")
      .Double("model.ln_eps", m.cell_options.ln_eps, "Epsilon of the layer norms", 0.0, 1.0)
      .Double("model.embedding_init_std", m.embedding_init_std,
              "Standard deviation of the token and position tables", 0.0, kInf)
      .Enum("model.pooling", m.pooling, {"mean", "hopfield"},
            "Classification tasks (one target per sequence): how the token states are pooled "
            "before the head. mean, or hopfield: model.pooling_patterns learned state patterns "
            "retrieve from the states at the fixed point of the Hopfield energy (the patterns "
            "as an external field, so they learn through the implicit gradient), solved by "
            "model.attention_solver.*; the patterns' outputs are averaged")
      .Int("model.pooling_patterns", m.pooling_patterns,
           "pooling hopfield only (an error otherwise): number of learned state patterns", 1,
           4096)
      .Enum("model.lookup", m.lookup, {"none", "hopfield"},
            "An associative memory after the encoder, every kind: none, or hopfield: z <- z + "
            "lookup(z), each token queries model.lookup_size learned stored patterns and reads "
            "their learned targets at the fixed point of the Hopfield energy (the token as an "
            "external field), solved by model.attention_solver.*")
      .Int("model.lookup_size", m.lookup_size,
           "lookup hopfield only (an error otherwise): number of stored patterns", 1, 1 << 20);

  // ---- model.energy: EnergyBlockOptions (model.kind energy, and the energy
  // attention of a cell, model.attention)
  const EnergyBlockOptions e;
  const std::string en = "model.energy.";
  s.String(en + "layer", e.layer,
           "energy kind: the energy attention block, by registered name (built-in: hopfield, "
           "probabilistic, expfam, energy_transformer), unless model.attention names one")
      .Double(en + "beta", e.beta,
              "Energy attention: initial inverse temperature per head (hopfield, expfam and "
              "energy_transformer beta; probabilistic query precision alpha); 0: 1/sqrt(head "
              "width)",
              0.0, kInf)
      .Double(en + "value_precision", e.value_precision,
              "Energy attention, probabilistic only (an error for a config without it): initial "
              "value precision times the head width (beta_v = value_precision / head width; "
              "the EM value term's scale is about value_precision / 3 at initialisation); 0: "
              "one-step softmax attention",
              0.0, kInf)
      .Bool(en + "normalize_input", e.normalize_input,
            "Energy attention: layer norm of the block's input before its projections (keeps "
            "the operating point whatever the embedding scale)")
      .Enum(en + "key_grad", ToString(e.key_grad), {"full", "stop"},
            "energy, energy_transformer only (an error for a config without it): full keeps the "
            "key-side attention gradient (energy descent); stop holds keys fixed in the update")
      .Enum(en + "dynamics", ToString(e.dynamics), {"leaky", "non_leaky"},
            "energy, energy_transformer only (an error for a config without it): leaky has isolated "
            "fixed points; non_leaky (the reference Euler steps) does not, so solve it with few "
            "fixed steps")
      .Enum(en + "memory", ToString(e.memory), {"relu2", "softmax"},
            "energy, energy_transformer only (an error for a config without it): Hopfield memory "
            "term")
      .Int(en + "memories", e.memories,
           "energy, energy_transformer only (an error for a config without it): number of "
           "memories",
           1, 1 << 20)
      .Double(en + "step", e.step,
              "energy, energy_transformer only (an error for a config without it): Euler step alpha",
              1e-12, kInf)
      .Int(en + "key_adaptation.iterations", e.key_adaptation.iterations,
           "probabilistic: online key adaptation, MAP-EM iterations over the keys given the "
           "queries before value inference (0: off)",
           0, 1 << 16)
      .Double(en + "key_adaptation.prior_precision", e.key_adaptation.key_prior_precision,
              "probabilistic: precision of the Gaussian prior centring each adapted key on its "
              "projection (0: soft k-means)",
              0.0, kInf)
      .Bool(en + "key_adaptation.recentre_prior", e.key_adaptation.recentre_prior,
            "probabilistic: centre the prior on the current key at each iteration (the "
            "reference code's variant; not exact MAP-EM)")
      .Bool(en + "key_adaptation.adapt_precision", e.key_adaptation.adapt_precision,
            "probabilistic: also re-estimate each key's precision (Gamma prior)")
      .Double(en + "key_adaptation.precision_prior_shape",
              e.key_adaptation.precision_prior_shape,
              "probabilistic: shape of the key precisions' Gamma prior (>= 1)", 1.0, kInf)
      .Double(en + "key_adaptation.precision_prior_rate", e.key_adaptation.precision_prior_rate,
              "probabilistic: rate of the key precisions' Gamma prior", 0.0, kInf)
      .Enum(en + "measure", ToString(e.measure), {"discrete", "gaussian", "mixture"},
            "expfam: the intrinsic measure (discrete: the tokens' key patterns; gaussian, "
            "mixture: learned, the query as the field)")
      .Int(en + "components", e.components, "expfam, mixture measure: components", 1, 1 << 16);

  AddSolverKeys(s, "model.solver.", ImplicitOptions{});
  AddSolverKeys(s, "model.attention_solver.", DefaultAttentionSolverOptions());

  // ---- model.regularization
  AddOptionKeys(s, "model.regularization.", RegularizationOptions::Fields());

  // ---- train
  AddOptionKeys(s, "train.", TrainerOptions::Fields());
  s.Enum("train.optimizer.type", o.type, OptimizerRegistry().Names(),
         "Optimizer (OptimizerRegistry, training/optimizer.h)")
      .Double("train.optimizer.lr", o.learning_rate, "Base learning rate", 0.0, kInf)
      .Double("train.optimizer.momentum", o.momentum, "sgd: momentum", 0.0, 0.999999)
      .Bool("train.optimizer.nesterov", o.nesterov, "sgd: Nesterov momentum")
      .Double("train.optimizer.beta1", o.beta1, "adam/adamw: first-moment decay", 0.0, 0.999999)
      .Double("train.optimizer.beta2", o.beta2, "adam/adamw: second-moment decay", 0.0,
              0.999999)
      .Double("train.optimizer.epsilon", o.epsilon, "adam/adamw: denominator epsilon", 1e-30,
              1.0)
      .Double("train.optimizer.weight_decay", o.weight_decay,
              "Weight decay (decoupled for adamw, L2 for sgd and adam)", 0.0, kInf)
      .StringList("train.optimizer.no_weight_decay", o.no_weight_decay_suffixes, {},
                  "Parameter-name suffixes exempt from weight decay")
      .Enum("train.schedule.type", "cosine", {"constant", "step", "cosine"},
            "Learning-rate schedule after warm-up")
      .Int("train.schedule.warmup_steps", 20, "Linear warm-up steps", 0, kBig)
      .Int("train.schedule.step_size", 1000, "step: steps between decays", 1, kBig)
      .Double("train.schedule.gamma", 0.1, "step: decay factor", 1e-12, 1.0)
      .Double("train.schedule.min_ratio", 0.1, "cosine: final lr / base lr", 0.0, 1.0);

  // ---- eval
  AddOptionKeys(s, "eval.", EvalOptions::Fields());

  // ---- log
  AddOptionKeys(s, "log.", LogOptions::Fields());

  // ---- compare
  s.StringList("compare.variants", {"explicit", "tied", "implicit"}, {},
               "Variants trained by `stillpoint compare`: explicit, tied, implicit, "
               "implicit_<backward mode> (e.g. implicit_jfb), energy (model.energy.layer), "
               "energy_<layer> (e.g. energy_hopfield)")
      .StringList("compare.attention", {}, {},
                  "The attention x kind grid: attentions (softmax or registered energy "
                  "attentions) crossed with compare.kinds, variants named ATTENTION/KIND (e.g. "
                  "probabilistic/implicit; softmax/energy is skipped). When set, it replaces "
                  "compare.variants")
      .StringList("compare.kinds", {"explicit", "tied", "implicit", "energy"}, {},
                  "The kinds of the grid: explicit, tied, implicit, implicit_<backward mode>, "
                  "energy")
      .DoubleList("compare.seeds", {},
                  "Train each variant once per seed (whole numbers, each replacing `seed`) and "
                  "report mean ± standard deviation over them; empty: once, with `seed`",
                  0, static_cast<double>(kBig))
      .Int("compare.probe_batch_size", 32,
           "Probe batch of the gradient check after training: every variant with an implicit "
           "layer, its gradient against the reference (ift, GMRES to 1e-10)",
           1, 1 << 20);
  return s;
}

template <typename Enum, typename Parse>
Enum ParseEnum(const Config& config, const std::string& key, Parse parse) {
  Enum value{};
  const std::string text = config.GetString(key);
  SP_CHECK(parse(text, &value), "config key '", key, "': unknown value '", text, "'");
  return value;
}

}  // namespace

const ConfigSchema& StillpointSchema() {
  static const ConfigSchema schema = BuildSchema();
  return schema;
}

ImplicitOptions ImplicitOptionsFromConfig(const Config& c) {
  return ImplicitOptionsFromConfig(c, "model.solver.");
}

ImplicitOptions ImplicitOptionsFromConfig(const Config& c, const std::string& prefix) {
  ImplicitOptions options;
  options.forward = ReadOptionKeys(
      c, prefix + "forward.", ForwardSolverOptions::Fields(), options.forward,
      [&](const std::string& name) { return SolverKeyApplies(prefix, "forward." + name); });

  options.backward = ReadOptionKeys(
      c, prefix + "backward.", BackwardOptions::Fields(), options.backward,
      [&](const std::string& name) { return SolverKeyApplies(prefix, "backward." + name); });
  // The schema checks each key alone; the solvers' own rules (e.g. a
  // divergence factor of 0 or above 1) are checked here, before any work.
  std::string error;
  if (!options.IsValid(&error)) {
    throw ConfigError(c.source() + ": " + prefix.substr(0, prefix.size() - 1) + ": " + error);
  }
  return options;
}

// Throws a ConfigError naming key, the registered names and the closest one
// unless `name` is among `names`.
void CheckName(const Config& c,
               const std::string& key,
               const std::string& what,
               const std::string& name,
               const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  std::string message =
      c.Origin(key) + ": unknown " + what + " '" + name + "' in " + key + " (known: " + known + ")";
  const std::string closest = ClosestName(name, names);
  if (!closest.empty()) message += "; did you mean '" + closest + "'?";
  throw ConfigError(message);
}

EnergyBlockOptions EnergyBlockOptionsFromConfig(const Config& c) {
  EnergyBlockOptions e;
  const std::string en = "model.energy.";
  e.layer = c.GetString(en + "layer");
  CheckName(c, en + "layer", "energy layer", e.layer, EnergyBlockRegistry().Names());
  e.beta = c.GetDouble(en + "beta");
  e.value_precision = c.GetDouble(en + "value_precision");
  e.normalize_input = c.GetBool(en + "normalize_input");
  e.key_grad = ParseEnum<KeyGrad>(c, en + "key_grad", StringToKeyGrad);
  e.dynamics =
      ParseEnum<EnergyTransformerDynamics>(c, en + "dynamics", StringToEnergyTransformerDynamics);
  e.memory = ParseEnum<EnergyTransformerMemory>(c, en + "memory", StringToEnergyTransformerMemory);
  e.memories = c.GetInt(en + "memories");
  e.step = c.GetDouble(en + "step");
  KeyAdaptationOptions& k = e.key_adaptation;
  k.iterations = static_cast<int>(c.GetInt(en + "key_adaptation.iterations"));
  k.key_prior_precision = c.GetDouble(en + "key_adaptation.prior_precision");
  k.recentre_prior = c.GetBool(en + "key_adaptation.recentre_prior");
  k.adapt_precision = c.GetBool(en + "key_adaptation.adapt_precision");
  k.precision_prior_shape = c.GetDouble(en + "key_adaptation.precision_prior_shape");
  k.precision_prior_rate = c.GetDouble(en + "key_adaptation.precision_prior_rate");
  e.measure = ParseEnum<ExpFamMeasure>(c, en + "measure", StringToExpFamMeasure);
  e.components = c.GetInt(en + "components");
  return e;
}

// The energy blocks a config's models use: the model's (model.attention,
// or model.energy.layer for the energy kind) and every one a comparison
// trains (compare.attention, energy_<block> in compare.variants), so a key
// set for one variant of a comparison is not an error in another.
std::vector<std::string> EnergyBlocksInUse(const Config& c, const Config& defaults) {
  std::vector<std::string> blocks;
  const std::string attention = c.GetString("model.attention");
  if (attention != "softmax") blocks.push_back(attention);
  // The energy kind's block, or a block the config names on purpose (its
  // compare variants may be other kinds).
  const std::string layer = c.GetString("model.energy.layer");
  if (c.GetString("model.kind") == "energy" || layer != defaults.GetString("model.energy.layer")) {
    blocks.push_back(layer);
  }
  for (const std::string& a : c.GetStringList("compare.attention")) blocks.push_back(a);
  for (const std::string& v : c.GetStringList("compare.variants")) {
    if (v == "energy") blocks.push_back(c.GetString("model.energy.layer"));
    if (v.rfind("energy_", 0) == 0) blocks.push_back(v.substr(7));
  }
  return blocks;
}

// Whether c holds the default value of path.
bool HasDefaultValue(const Config& c, const Config& defaults, const std::string& path) {
  switch (StillpointSchema().Find(path)->type) {
    case ConfigType::kBool:
      return c.GetBool(path) == defaults.GetBool(path);
    case ConfigType::kInt:
      return c.GetInt(path) == defaults.GetInt(path);
    case ConfigType::kDouble:
      return c.GetDouble(path) == defaults.GetDouble(path);
    default:
      return c.GetString(path) == defaults.GetString(path);
  }
}

// A model.energy.* key that only one block reads, set to another value than
// its default in a config whose models never use that block, is an error
// naming the key and the block. (Compared with the default rather than by
// origin: a run's stored config spells out every key.)
void CheckEnergyKeysAreRead(const Config& c) {
  static const Config defaults = Config::FromYaml(StillpointSchema(), "", "defaults");
  static const std::vector<std::pair<std::string, std::string>> kOwners = {
      {"value_precision", "probabilistic"},
      {"key_adaptation.iterations", "probabilistic"},
      {"key_adaptation.prior_precision", "probabilistic"},
      {"key_adaptation.recentre_prior", "probabilistic"},
      {"key_adaptation.adapt_precision", "probabilistic"},
      {"key_adaptation.precision_prior_shape", "probabilistic"},
      {"key_adaptation.precision_prior_rate", "probabilistic"},
      {"measure", "expfam"},
      {"components", "expfam"},
      {"key_grad", "energy_transformer"},
      {"dynamics", "energy_transformer"},
      {"memory", "energy_transformer"},
      {"memories", "energy_transformer"},
      {"step", "energy_transformer"}};
  const std::vector<std::string> blocks = EnergyBlocksInUse(c, defaults);
  for (const auto& [key, owner] : kOwners) {
    const std::string path = "model.energy." + key;
    if (HasDefaultValue(c, defaults, path)) continue;
    if (std::find(blocks.begin(), blocks.end(), owner) != blocks.end()) continue;
    std::string used;
    for (const std::string& b : blocks) used += (used.empty() ? "" : ", ") + b;
    throw ConfigError(c.Origin(path) + ": " + path + " is read only by the " + owner +
                      " energy attention, and " +
                      (used.empty() ? std::string("this config uses no energy attention")
                                    : "this config uses " + used) +
                      " (set model.attention or model.energy.layer to " + owner +
                      ", or remove the key)");
  }
}

// model.pooling_patterns and model.lookup_size set away from their defaults
// without the Hopfield pooling or lookup that reads them are errors.
void CheckReadoutKeysAreRead(const Config& c, const ModelOptions& m) {
  static const Config defaults = Config::FromYaml(StillpointSchema(), "", "defaults");
  if (m.pooling != "hopfield" && !HasDefaultValue(c, defaults, "model.pooling_patterns")) {
    throw ConfigError(c.Origin("model.pooling_patterns") +
                      ": model.pooling_patterns is read only with model.pooling: hopfield "
                      "(this config pools by " + m.pooling + ")");
  }
  if (m.lookup != "hopfield" && !HasDefaultValue(c, defaults, "model.lookup_size")) {
    throw ConfigError(c.Origin("model.lookup_size") +
                      ": model.lookup_size is read only with model.lookup: hopfield (this "
                      "config has no lookup)");
  }
}

ModelOptions ModelOptionsFromConfig(const Config& c) {
  ModelOptions m;
  m.kind = ParseEnum<ModelKind>(c, "model.kind", StringToModelKind);
  m.dtype = ParseEnum<DType>(c, "dtype", StringToDType);
  m.dim = c.GetInt("model.dim");
  m.max_length = c.GetInt("model.max_length");
  m.cell = c.GetString("model.cell");
  if (!CellRegistry().Has(m.cell)) {
    std::string known;
    for (const std::string& name : CellRegistry().Names()) {
      known += (known.empty() ? "" : ", ") + name;
    }
    throw ConfigError(c.Origin("model.cell") + ": unknown cell '" + m.cell +
                      "' in model.cell (known: " + known + ")");
  }
  m.cell_options.dim = m.dim;
  m.cell_options.heads = c.GetInt("model.heads");
  m.cell_options.hidden = c.GetInt("model.hidden");
  m.cell_options.ln_eps = c.GetDouble("model.ln_eps");
  m.cell_options.dropout = c.GetDouble("model.dropout");
  m.cell_options.dropout_seed = static_cast<uint64_t>(c.GetInt("seed")) + 17;
  m.cell_options.dtype = m.dtype;
  m.num_layers = c.GetInt("model.num_layers");
  m.unroll_steps = c.GetInt("model.unroll_steps");
  m.embedding_init_std = c.GetDouble("model.embedding_init_std");
  m.head_ln_eps = c.GetDouble("model.ln_eps");
  m.seed = static_cast<uint64_t>(c.GetInt("seed"));
  m.implicit = ImplicitOptionsFromConfig(c);
  // The fixed-point correction loss is taken on iterates the solve keeps.
  const RegularizationOptions regularization = RegularizationOptions::FromConfig(c);
  if (regularization.correction_weight > 0) {
    m.implicit.sampled_iterates = static_cast<int>(regularization.correction_iterates);
  }
  m.energy = EnergyBlockOptionsFromConfig(c);
  m.energy.dim = m.dim;
  m.energy.heads = m.cell_options.heads;
  m.energy.dtype = m.dtype;
  m.cell_options.attention = c.GetString("model.attention");
  std::vector<std::string> attentions = {"softmax"};
  for (const std::string& name : EnergyBlockRegistry().Names()) attentions.push_back(name);
  CheckName(c, "model.attention", "attention", m.cell_options.attention, attentions);
  m.cell_options.energy = m.energy;
  CheckEnergyKeysAreRead(c);
  m.pooling = c.GetString("model.pooling");
  m.pooling_patterns = c.GetInt("model.pooling_patterns");
  m.lookup = c.GetString("model.lookup");
  m.lookup_size = c.GetInt("model.lookup_size");
  CheckReadoutKeysAreRead(c, m);
  if (m.cell_options.attention != "softmax" || m.pooling != "mean" || m.lookup != "none") {
    m.cell_options.attention_solver = ImplicitOptionsFromConfig(c, "model.attention_solver.");
  }
  SP_CHECK(m.dim % m.cell_options.heads == 0, c.Origin("model.dim"), ": model.dim (", m.dim,
           ") must be a multiple of model.heads (", m.cell_options.heads, ")");
  return m;
}

OptimizerOptions OptimizerOptionsFromConfig(const Config& c) {
  OptimizerOptions o;
  o.type = c.GetString("train.optimizer.type");
  o.learning_rate = c.GetDouble("train.optimizer.lr");
  o.momentum = c.GetDouble("train.optimizer.momentum");
  o.nesterov = c.GetBool("train.optimizer.nesterov");
  o.beta1 = c.GetDouble("train.optimizer.beta1");
  o.beta2 = c.GetDouble("train.optimizer.beta2");
  o.epsilon = c.GetDouble("train.optimizer.epsilon");
  o.weight_decay = c.GetDouble("train.optimizer.weight_decay");
  o.no_weight_decay_suffixes = c.GetStringList("train.optimizer.no_weight_decay");
  std::string error;
  if (!o.IsValid(&error)) throw ConfigError(c.source() + ": train.optimizer: " + error);
  return o;
}

ScheduleOptions ScheduleOptionsFromConfig(const Config& c) {
  ScheduleOptions s;
  s.type = ParseEnum<ScheduleType>(c, "train.schedule.type", StringToScheduleType);
  s.warmup_steps = c.GetInt("train.schedule.warmup_steps");
  s.step_size = c.GetInt("train.schedule.step_size");
  s.gamma = c.GetDouble("train.schedule.gamma");
  s.min_ratio = c.GetDouble("train.schedule.min_ratio");
  s.total_steps = std::max<int64_t>(1, c.GetInt("train.steps"));
  return s;
}

std::string ConfigReferenceMarkdown() {
  return "# Configuration reference\n\n"
         "Generated from the schema in `training/config_schema.cc` by `stillpoint config "
         "--doc`; a test keeps this file identical to it. Every key is optional unless marked "
         "required; unknown keys, wrong types and out-of-range values are errors that name the "
         "file, line, column and key. Any key can be overridden on the command line as "
         "`key.path=value`.\n" +
         StillpointSchema().ToMarkdown();
}

}  // namespace stillpoint
