// Compiles: training sees every library folder's public headers.
#include "framework/buffer_pool.h"
#include "framework/ops_hopfield.h"
#include "layers/models.h"
#include "training/trainer.h"
