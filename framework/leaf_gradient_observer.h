// A hook into backward() sweeps: which leaves' gradients are complete.
#pragma once

#include <functional>

#include "framework/autograd.h"

namespace stillpoint {

// Watches the backward() sweeps that run on this thread while it lives:
// `observer` is called with each leaf right after the sweep adds the leaf's
// gradient, which is then complete for that sweep (a sweep reaches a leaf
// once, after every op that used it). Data-parallel training uses it to send
// finished gradients to other processes while the rest of the backward pass
// runs (training/gradient_reducer.h). grad() sweeps are not observed. The
// observer must outlive the scope.
class ScopedLeafGradientObserver {
 public:
  using Observer = std::function<void(const Var& leaf)>;
  explicit ScopedLeafGradientObserver(const Observer* observer);
  ~ScopedLeafGradientObserver();
  ScopedLeafGradientObserver(const ScopedLeafGradientObserver&) = delete;
  ScopedLeafGradientObserver& operator=(const ScopedLeafGradientObserver&) = delete;

 private:
  const Observer* previous_;
};

}  // namespace stillpoint
