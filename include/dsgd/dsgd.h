// dsgd/dsgd.h — every public header at once, for the simple case: a program linking dsgd::dsgd.
//
//   #include <dsgd/dsgd.h>
//   dsgd::Trainer trainer(dsgd::operator_of<MyOperator>(), {.num_workers = 4, .strategy = "allreduce"});
//
// Each library's headers live in its own folder, include/dsgd/<library>/, and a program that
// links one library (dsgd::dsgd_runtime, ...) includes from that library's folder and the ones
// below it:
//   common/   torch-free vocabulary: errors, TrainerConfig, logging        (every library)
//   comm/     groups, stores, collectives                                  dsgd::dsgd_comm
//   torch/    TrainingOperator, Dataset, Metrics, SyncBatchNorm, sgd       dsgd::dsgd_torch
//   data/     Fashion-MNIST, synthetic images, token files                 dsgd::dsgd_data
//   models/   the reference models by name, the GPT                        dsgd::dsgd_models
//   runtime/  Trainer, fit, settings, evaluator, cluster spec, workers     dsgd::dsgd_runtime
//   apps/     the image classifier, the language model, the local job      dsgd::dsgd_apps
//   tune/     hyper-parameter search                                       dsgd::dsgd_tune
#pragma once

#include "dsgd/apps/image_classifier.h"
#include "dsgd/apps/language_model.h"
#include "dsgd/apps/local_job.h"
#include "dsgd/common/error.h"
#include "dsgd/common/trainer_config.h"
#include "dsgd/data/datasets.h"
#include "dsgd/data/text.h"
#include "dsgd/models/registry.h"
#include "dsgd/runtime/fit.h"
#include "dsgd/runtime/remote.h"
#include "dsgd/runtime/settings.h"
#include "dsgd/runtime/trainer.h"
#include "dsgd/torch/dataset.h"
#include "dsgd/torch/operator.h"
#include "dsgd/tune/tuner.h"
