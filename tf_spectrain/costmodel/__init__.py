"""A cost model of pipelined and data-parallel training on multi-device machines.

It predicts one training iteration, and images/s, from per-layer compute times, activation
and weight sizes, the cut points and a `Hardware` description, for one device, data
parallelism (ring all-reduce every step), the asynchronous SpecTrain pipeline (1F1B), R
replicas of such a pipeline and the synchronous pipeline (GPipe or 1F1B-flush), on one host
or several (`Hardware(num_hosts=...)`).
Everything here is pure Python except `profile_model`, which measures a Keras model with
TensorFlow (imported on first use). docs/COSTMODEL.md gives the equations.

    profile = costmodel.profile_model(model, batch_size=32)
    gpus = costmodel.PCIE3_X16.replace(relative_speed=150.0)
    cuts = costmodel.best_cuts(profile, gpus, batch_size=128)
    dp = costmodel.predict_data_parallel(profile, gpus, 128)
    pipe = costmodel.predict_pipeline(profile, gpus, 128, cuts, num_batches=391)
    print(pipe.images_per_second / dp.images_per_second)

Before a run, `plan_pipeline(model, devices, batch_size, cuts=..., memory_limit="16GiB",
mode=..., micro_batches=...)` prices a pipeline's cuts (or plans them) and sets each
stage's predicted memory against its device's: `print` the returned `RunPlan`.
"""

from tf_spectrain.costmodel.async_pipeline import predict_hybrid, predict_pipeline
from tf_spectrain.costmodel.hardware import NVLINK, PCIE3_X16, Hardware
from tf_spectrain.costmodel.plan import PartitionPlan
from tf_spectrain.costmodel.planning import MemoryLimitError, best_cuts, plan_partition
from tf_spectrain.costmodel.predict import (
    Estimate,
    pipeline_times,
    predict_data_parallel,
    predict_single,
)
from tf_spectrain.costmodel.profile import (
    LayerProfile,
    ModelProfile,
    StageCost,
    calibrate_stages,
)
from tf_spectrain.costmodel.run_plan import RunPlan, parse_memory_size
from tf_spectrain.costmodel.runtime_costs import PASS_BY_PASS, WINDOWS, RuntimeCosts
from tf_spectrain.costmodel.simulate import simulate_epoch, steady_cycle
from tf_spectrain.costmodel.stage_terms import StageEstimate, StageTerms
from tf_spectrain.costmodel.sync_pipeline import predict_sync

_MEASURING = ("profile_model", "measure_link", "measure_concurrency", "measure_stages")


def __getattr__(name):
    # The measuring functions need TensorFlow; import them only when asked for.
    if name in _MEASURING:
        from tf_spectrain.costmodel import measure

        return getattr(measure, name)
    if name in ("plan_pipeline", "price_cuts"):
        from tf_spectrain.costmodel import preflight

        return getattr(preflight, name)
    if name == "auto_partition":
        from tf_spectrain.costmodel import autoplan

        return autoplan.auto_partition
    raise AttributeError(f"module 'tf_spectrain.costmodel' has no attribute {name!r}")


__all__ = [
    "Estimate",
    "Hardware",
    "LayerProfile",
    "MemoryLimitError",
    "ModelProfile",
    "NVLINK",
    "PASS_BY_PASS",
    "PCIE3_X16",
    "PartitionPlan",
    "RunPlan",
    "RuntimeCosts",
    "StageCost",
    "StageEstimate",
    "StageTerms",
    "WINDOWS",
    "auto_partition",
    "calibrate_stages",
    "best_cuts",
    "measure_concurrency",
    "measure_link",
    "measure_stages",
    "pipeline_times",
    "parse_memory_size",
    "plan_partition",
    "plan_pipeline",
    "predict_data_parallel",
    "predict_hybrid",
    "predict_pipeline",
    "predict_single",
    "predict_sync",
    "price_cuts",
    "profile_model",
    "simulate_epoch",
    "steady_cycle",
]
