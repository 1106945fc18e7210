#include "training/config_schema.h"

#include <algorithm>
#include <limits>

#include "layers/energy_attention.h"
#include "layers/energy_block.h"
#include "layers/registry.h"
#include "training/data/dataset_registry.h"
#include "training/health.h"
#include "training/config/option_schema.h"
#include "training/trainer_options.h"

namespace stillpoint {
namespace {

constexpr int64_t kBig = int64_t{1} << 40;

// compare.variants' default: the kinds that run a cell (energy needs an
// energy attention, so it is not a default variant).
std::vector<std::string> CellModelKindNames() {
  std::vector<std::string> names;
  for (ModelKind kind : AllModelKinds()) {
    if (kind != ModelKind::kEnergy) names.push_back(ToString(kind));
  }
  return names;
}

// compare.variants' doc (from the model kinds' list).
std::string CompareVariantsDoc() {
  std::string doc = "Variants trained by `stillpoint compare`: ";
  for (const std::string& kind : ModelKindNames()) {
    doc += kind;
    if (kind == "implicit") doc += ", implicit_<backward mode> (e.g. implicit_jfb)";
    if (kind == "energy") doc += " (model.energy.layer), energy_<layer> (e.g. energy_hopfield)";
    doc += ", ";
  }
  return doc.substr(0, doc.size() - 2);
}

// compare.kinds' doc: "The kinds of the grid: explicit, tied, implicit,
// implicit_<backward mode>, energy" (from the model kinds' list).
std::string CompareKindsDoc() {
  std::string doc = "The kinds of the grid: ";
  for (const std::string& kind : ModelKindNames()) {
    doc += kind + (kind == "implicit" ? ", implicit_<backward mode>" : "") + ", ";
  }
  return doc.substr(0, doc.size() - 2);
}

// Whether a solver key exists under prefix: the inner solve of an energy
// attention has no adjoint warm start (one call site serves every
// evaluation of the cell, so there is no previous adjoint of the same
// problem; its forward warm start within an outer solve is
// model.attention_solver.warm_start) and no divergence break (its maps are
// the catalogue's bounded EM/CCCP updates).
bool SolverKeyApplies(const std::string& prefix, const std::string& key) {
  if (prefix != "model.attention_solver.") return true;
  return key != "backward.warm_start" && key != "forward.divergence_factor";
}

// The float64 defaults of the solver tolerances, and the budgets that let
// a contracting solve reach them (see BuildSchema).
const std::pair<const char*, const char*> kFloat64Tolerances[] = {
    {"forward.relative_tolerance", "1e-10"},
    {"forward.absolute_tolerance", "1e-12"},
    {"forward.max_iterations", "100"},
    {"backward.tolerance", "1e-10"},
    {"backward.max_iterations", "100"}};

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

// The names of fields' fields up to and including `last`, in order.
template <typename Options>
std::vector<std::string> FieldsThrough(const OptionFields<Options>& fields,
                                       const std::string& last) {
  std::vector<std::string> names;
  for (const auto& field : fields.fields()) {
    names.push_back(field.name);
    if (field.name == last) return names;
  }
  throw std::logic_error("FieldsThrough: no field '" + last + "'");
}

template <typename Options>
const typename OptionFields<Options>::Field& FindField(const OptionFields<Options>& fields,
                                                      const std::string& name) {
  for (const auto& field : fields.fields()) {
    if (field.name == name) return field;
  }
  throw std::logic_error("FindField: no field '" + name + "'");
}

ConfigSchema BuildSchema() {
  const OptimizerOptions o;
  ConfigSchema s;
  s.Int("seed", 0, "Seed of parameter initialisation, data generation and data order", 0, kBig)
      .Int("threads", 2, "Worker threads for every parallel loop (results are bitwise "
                         "reproducible for a given count)", 1, 256)
      .Enum("dtype", "float32", {"float32", "float64"}, "Number type of parameters and states");

  // ---- task: task.kind and the keys of the tasks (training/data/task_list.h)
  AddTaskKeys(s);
  s.Int("task.max_file_mib", static_cast<int64_t>(ReadLimit::kDefaultMaxMib),
        "The most MiB read from one data file of any task (after decompression): a bigger, "
        "endless (/dev/zero) or gzip-bomb file is refused naming this key",
        1, 1 << 24);

  // ---- model: ModelOptions, with the cell's keys and model.energy.*
  // (EnergyBlockOptions); model.init_from (read by BuildExperiment, not by the
  // model) after model.dropout
  const ModelOptions m = ConfigModelDefaults();
  const std::vector<std::string> before_init_from = FieldsThrough(ModelOptions::Fields(), "dropout");
  const auto is_before_init_from = [&](const std::string& name) {
    return std::find(before_init_from.begin(), before_init_from.end(), name) !=
           before_init_from.end();
  };
  AddOptionKeys(s, "model.", ModelOptions::Fields(), m, is_before_init_from);
  s.String("model.init_from", "",
           "Initial parameters from a .safetensors or .npz file (stillpoint export), matched by "
           "name; every parameter must be present, with its shape (a path relative to the config "
           "file); empty: the random initialisation");
  AddOptionKeys(s, "model.", ModelOptions::Fields(), m,
                [&](const std::string& name) { return !is_before_init_from(name); });

  AddSolverKeys(s, "model.solver.", ImplicitOptions{});
  // model.kind implicit's adjoint is Anderson (DefaultModelSolverOptions);
  // the energy kind keeps the fixed-point one, with which the energy models of
  // the examples were measured (examples/custom_layer_from_yaml learns 29.95%
  // with an Anderson adjoint at its expanding fixed point, radius 1.4).
  s.DefaultFollows("model.solver.backward.solver", "model.kind",
                   {{"implicit", ToString(DefaultModelSolverOptions().backward.solver)}});
  AddSolverKeys(s, "model.attention_solver.", DefaultAttentionSolverOptions());
  // The tolerances follow the dtype: the declared defaults are sized for
  // float32; a float64 model's solves default to float64-sized ones (and
  // budgets to reach them), so its gradients are exact to what a float64
  // gradient check resolves.
  for (const std::string prefix : {"model.solver.", "model.attention_solver."}) {
    for (const auto& [key, float64] : kFloat64Tolerances) {
      s.DefaultFollows(prefix + key, "dtype", {{"float64", float64}});
    }
  }
  // The Energy Transformer's attention energy is concave, and trained freely
  // its inner maps expand (attention_spectral_radius_* below holds them):
  // its inner solves need more iterations than the contracting blocks', and
  // GMRES for the adjoint: at the radius the penalty holds, the fixed-point
  // adjoint's budget does not reach its tolerance (docs/energy-layers.md).
  const std::string energy_transformer = "energy_transformer";
  s.DefaultFollows("model.attention_solver.forward.max_iterations", "model.attention",
                   {{energy_transformer, "40"}});
  s.DefaultFollows("model.attention_solver.backward.solver", "model.attention",
                   {{energy_transformer, "gmres"}});
  s.DefaultFollows("model.attention_solver.backward.max_iterations", "model.attention",
                   {{energy_transformer, "40"}});
  {
    const auto& warm = FindField(CellOptions::Fields(), "attention_solver.warm_start");
    s.Bool("model.attention_solver.warm_start", CellOptions{}.attention_warm_start, warm.doc);
  }

  // ---- model.regularization
  AddOptionKeys(s, "model.regularization.", RegularizationOptions::Fields());
  for (const auto& [name, value] : ImplicitModelRegularization()) {
    s.DefaultFollows("model.regularization." + name, "model.kind", {{"implicit", value}});
  }
  // The Energy Transformer inside the cells gets the attention penalty (it
  // applies to no other kind: the energy kind's block ignores it).
  s.DefaultFollows("model.regularization.attention_spectral_radius_weight", "model.attention",
                   {{energy_transformer, "30"}});

  // ---- train
  AddOptionKeys(s, "train.", TrainerOptions::Fields());
  // train.optimizer.type accepts the registered optimizers' names.
  const auto& type = FindField(OptimizerOptions::Fields(), "type");
  s.Enum("train.optimizer.type", type.Text(o), OptimizerRegistry().Names(), type.doc);
  AddOptionKeys(s, "train.optimizer.", OptimizerOptions::Fields(), o,
                [](const std::string& name) { return name != "type"; });
  AddOptionKeys(s, "train.schedule.", ScheduleOptions::Fields());

  // ---- eval
  AddOptionKeys(s, "eval.", EvalOptions::Fields());

  // ---- log
  AddOptionKeys(s, "log.", LogOptions::Fields());

  // ---- health (the equilibrium verdict of summary.json)
  AddOptionKeys(s, "health.", HealthOptions::Fields());

  // ---- compare
  s.StringList("compare.variants", CellModelKindNames(), {},
               CompareVariantsDoc())
      .StringList("compare.attention", {}, {},
                  "The attention x kind grid: attentions (softmax or registered energy "
                  "attentions) crossed with compare.kinds, variants named ATTENTION/KIND (e.g. "
                  "probabilistic/implicit; softmax/energy is skipped). When set, it replaces "
                  "compare.variants")
      .StringList("compare.kinds", ModelKindNames(), {}, CompareKindsDoc())
      .StringList("compare.overrides", {}, {},
                  "Settings of single variants, each VARIANT:KEY=VALUE (e.g. "
                  "implicit:train.optimizer.lr=2.0e-3), applied after the variant's own; "
                  "VARIANT is one the comparison trains. Every variant's summary and the report "
                  "list the overrides it ran with")
      .DoubleList("compare.seeds", {},
                  "Train each variant once per seed (whole numbers, each replacing `seed`) and "
                  "report mean ± standard deviation over them; empty: once, with `seed`",
                  0, static_cast<double>(kBig));
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

// The model's own solve (model.solver.*) as a config declares it by
// default for model.kind implicit: ImplicitOptions' defaults with an Anderson
// adjoint. At the radii
// the implicit models train to (0.65-0.85 on the quickstart) fixed-point
// adjoint iterations shrink the error by only that much each (10 leave about
// 0.1-0.2); Anderson's 10 to 20 reach 1e-4 where the spectral-radius penalty
// holds the radius (ImplicitModelRegularization).
ImplicitOptions DefaultModelSolverOptions() {
  ImplicitOptions options;
  options.backward.solver = AdjointSolverType::kAnderson;
  return options;
}

// A config's positional table has 64 rows unless it says otherwise; the
// struct's 32 serve models built by hand (their tests' initialisations
// depend on it).
ModelOptions ConfigModelDefaults() {
  ModelOptions m;
  m.max_length = 64;
  return m;
}

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
  // divergence factor of 0 or above 1) are checked here, before any work,
  // and named by the user's key (model.solver.forward.fallback_chain), not
  // by the struct that holds it (ForwardSolverOptions).
  std::string error;
  const auto keyed = [&](const std::string& section, const std::string& struct_name) {
    const std::string lead = struct_name + ": ";
    const std::string problem =
        error.rfind(lead, 0) == 0 ? error.substr(lead.size()) : error;
    return ConfigError(c.source() + ": " + prefix + section + problem);
  };
  if (!options.forward.IsValid(&error)) throw keyed("forward.", "ForwardSolverOptions");
  if (!options.backward.IsValid(&error)) throw keyed("backward.", "BackwardOptions");
  if (!options.IsValid(&error)) throw keyed("", "ImplicitOptions");
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
  EnergyBlockOptions e = ReadOptionKeys(c, "model.energy.", EnergyBlockOptions::Fields());
  CheckName(c, "model.energy.layer", "energy layer", e.layer, EnergyBlockRegistry().Names());
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
  const std::vector<std::string> blocks = EnergyBlocksInUse(c, defaults);
  for (const auto& field : EnergyBlockOptions::Fields().fields()) {
    if (!field.in_config || !field.applies) continue;
    const std::string path = "model.energy." + field.name;
    if (HasDefaultValue(c, defaults, path)) continue;
    // The registered blocks that read the key (AppliesWhen of its field).
    std::string owners;
    bool read = false;
    for (const std::string& name : EnergyBlockRegistry().Names()) {
      EnergyBlockOptions probe;
      probe.layer = name;
      if (!field.applies(probe)) continue;
      owners += (owners.empty() ? "" : " or ") + name;
      read = read || std::find(blocks.begin(), blocks.end(), name) != blocks.end();
    }
    if (read) continue;
    std::string used;
    for (const std::string& b : blocks) used += (used.empty() ? "" : ", ") + b;
    throw ConfigError(c.Origin(path) + ": " + path + " is read only by the " + owners +
                      " energy attention, and " +
                      (used.empty() ? std::string("this config uses no energy attention")
                                    : "this config uses " + used) +
                      " (set model.attention or model.energy.layer to " + owners +
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

// model.positions, model.attention_mask and model.attention_window against
// each other and the head width, each error naming its key.
void CheckLayoutKeys(const Config& c, const ModelOptions& m) {
  const int64_t head_dim = m.dim / m.cell_options.heads;
  auto fail = [&](const std::string& key, const std::string& why) {
    throw ConfigError(c.Origin(key) + ": " + key + ": " + why);
  };
  const int64_t window = m.attention_window;
  if (m.attention_mask == AttentionMaskKind::kLocal && window < 1) {
    fail("model.attention_window", "attention_mask local needs a window >= 1, got " +
                                       std::to_string(window));
  }
  if (m.attention_mask == AttentionMaskKind::kNone && window != 0) {
    fail("model.attention_window", std::to_string(window) +
                                       " is read only with model.attention_mask causal or local "
                                       "(this config's mask is none)");
  }
  const bool energy_transformer =
      m.cell_options.attention == "energy_transformer" ||
      (m.kind == ModelKind::kEnergy && m.cell_options.attention == "softmax" &&
       m.energy.layer == "energy_transformer");
  if (energy_transformer && m.attention_mask == AttentionMaskKind::kCausal &&
      m.energy.key_grad != KeyGrad::kStop) {
    fail("model.energy.key_grad",
         "energy_transformer under model.attention_mask causal needs key_grad stop: the full "
         "key-side force moves earlier tokens with later queries, so the fixed point would not "
         "be causal");
  }
  if (m.positions == PositionScheme::kRotary && head_dim % 2 != 0) {
    fail("model.positions", "rotary needs an even head width (model.dim / model.heads), got " +
                                std::to_string(head_dim));
  }
  if (m.positions == PositionScheme::kRotary2d && head_dim % 4 != 0) {
    fail("model.positions",
         "rotary_2d needs a head width (model.dim / model.heads) that is a multiple of 4, got " +
             std::to_string(head_dim));
  }
}

ModelOptions ModelOptionsFromConfig(const Config& c) {
  ModelOptions m = ReadOptionKeys(
      c, "model.", ModelOptions::Fields(), ConfigModelDefaults(),
      [](const std::string& name) { return name.rfind("energy.", 0) != 0; });
  if (!CellRegistry().Has(m.cell)) {
    std::string known;
    for (const std::string& name : CellRegistry().Names()) {
      known += (known.empty() ? "" : ", ") + name;
    }
    throw ConfigError(c.Origin("model.cell") + ": unknown cell '" + m.cell +
                      "' in model.cell (known: " + known + ")");
  }
  // What the top-level keys and one key for several fields set.
  m.dtype = ParseEnum<DType>(c, "dtype", StringToDType);
  m.seed = static_cast<uint64_t>(c.GetInt("seed"));
  m.head_ln_eps = m.cell_options.ln_eps;  // model.ln_eps: every layer norm
  m.cell_options.dim = m.dim;
  m.cell_options.dropout_seed = m.seed + 17;
  m.cell_options.dtype = m.dtype;
  m.implicit = ImplicitOptionsFromConfig(c);
  // The fixed-point correction loss is taken on iterates the solve keeps.
  const RegularizationOptions regularization = RegularizationOptions::FromConfig(c);
  if (regularization.correction_weight > 0) {
    m.implicit.sampled_iterates = static_cast<int>(regularization.correction_iterates);
  }
  // The attention penalty is taken at the inner solutions the attentions keep.
  m.keep_attention_inputs = regularization.attention_spectral_radius_weight > 0;
  m.energy = EnergyBlockOptionsFromConfig(c);
  m.energy.dim = m.dim;
  m.energy.heads = m.cell_options.heads;
  m.energy.dtype = m.dtype;
  CheckName(c, "model.attention", "attention", m.cell_options.attention, AttentionKindNames());
  m.cell_options.energy = m.energy;
  CheckEnergyKeysAreRead(c);
  CheckReadoutKeysAreRead(c, m);
  if (m.cell_options.attention != "softmax" || m.pooling != "mean" || m.lookup != "none") {
    m.cell_options.attention_solver = ImplicitOptionsFromConfig(c, "model.attention_solver.");
  }
  m.cell_options.attention_warm_start = c.GetBool("model.attention_solver.warm_start");
  SP_CHECK(m.dim % m.cell_options.heads == 0, c.Origin("model.dim"), ": model.dim (", m.dim,
           ") must be a multiple of model.heads (", m.cell_options.heads, ")");
  CheckLayoutKeys(c, m);
  return m;
}

OptimizerOptions OptimizerOptionsFromConfig(const Config& c) {
  const OptimizerOptions o = ReadOptionKeys(c, "train.optimizer.", OptimizerOptions::Fields());
  std::string error;
  if (!o.IsValid(&error)) throw ConfigError(c.source() + ": train.optimizer: " + error);
  return o;
}

ScheduleOptions ScheduleOptionsFromConfig(const Config& c) {
  ScheduleOptions s = ReadOptionKeys(c, "train.schedule.", ScheduleOptions::Fields());
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
