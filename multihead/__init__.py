"""multihead: a shared trunk, several heads, one loss and one optimizer per head.

Each head's optimizer is built on exactly the trunk's variables plus that
head's own, and per-head training is visible in TensorBoard.

The public names are imported when first used (`mh.Trainer` imports TensorFlow), so
`import multihead` alone, and `multihead --help`, import no TensorFlow.
"""

import importlib as _importlib
import os as _os
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

# TensorFlow's C++ start-up chatter (CUDA probing, oneDNN notices) hides real output.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: Public name -> the module that defines it.
_EXPORTS = {
    "AGGREGATORS": "multihead.aggregation",
    "LOSS_WEIGHTINGS": "multihead.aggregation",
    "Aggregation": "multihead.aggregation",
    "Aggregator": "multihead.aggregation",
    "Buffered": "multihead.aggregation",
    "BufferedAggregator": "multihead.aggregation",
    "CoordinatewiseAggregator": "multihead.aggregation",
    "GramianWeighting": "multihead.aggregation",
    "LossWeighting": "multihead.aggregation",
    "StatefulGramianWeighting": "multihead.aggregation",
    "StateSpec": "multihead.aggregation",
    "Weighting": "multihead.aggregation",
    "aggregate": "multihead.aggregation",
    "CheckpointMismatchError": "multihead.io.checkpoint_file",
    "CheckpointReadError": "multihead.io.checkpoint_file",
    "BestCheckpoint": "multihead.io.best_checkpoint",
    "checkpoint_parts": "multihead.io.checkpoints",
    "restore_checkpoint": "multihead.io.checkpoints",
    "save_checkpoint": "multihead.io.checkpoints",
    "CheckpointManager": "multihead.io.manager",
    "available_parts": "multihead.io.checkpoint_parts",
    "Callback": "multihead.training.callbacks",
    "EarlyStopping": "multihead.training.callbacks",
    "HeadEarlyStopping": "multihead.training.head_early_stopping",
    "LambdaCallback": "multihead.training.callbacks",
    "ReduceLROnPlateau": "multihead.training.callbacks",
    "TerminateOnNonFinite": "multihead.training.callbacks",
    "MultiTaskData": "multihead.datasets.multitask",
    "as_dataset": "multihead.datasets.multitask",
    "batches_per_epoch": "multihead.training.streams",
    "mmoe_synthetic": "multihead.datasets.multitask",
    "make_strategy": "multihead.step.distribute",
    "ExportResult": "multihead.io.export",
    "export_saved_model": "multihead.io.export",
    "MultiHeadModel": "multihead.training.keras_model",
    "CGC": "multihead.model.architectures",
    "MMoE": "multihead.model.architectures",
    "MTAN": "multihead.model.architectures",
    "OMoE": "multihead.model.architectures",
    "PLE": "multihead.model.architectures",
    "CrossStitch": "multihead.model.architectures",
    "DSelectK": "multihead.model.architectures",
    "Monitor": "multihead.monitoring.monitor",
    "Objective": "multihead.objectives.objective",
    "DynamicLossScale": "multihead.step.loss_scales",
    "StepOptions": "multihead.step.options",
    "Partition": "multihead.model.partition",
    "RunReport": "multihead.monitoring.report",
    "load_report": "multihead.monitoring.report",
    "Grouping": "multihead.monitoring.groupings",
    "task_groupings": "multihead.monitoring.groupings",
    "ReplayBuffer": "multihead.rl.replay",
    "TargetNetwork": "multihead.rl.target_network",
    "variable_addresses": "multihead.model.addresses",
    "ImportReport": "multihead.io.tf1_import",
    "import_tf1_checkpoint": "multihead.io.tf1_import",
    "TaskSampling": "multihead.training.sampling",
    "History": "multihead.training.trainer",
    "StepResult": "multihead.training.trainer",
    "Trainer": "multihead.training.trainer",
    "SettingError": "multihead.settings",
    "TrainingState": "multihead.training.training_state",
    "TrunkPolicy": "multihead.step.trunk_update",
    "TrunkRule": "multihead.step.trunk_rule",
    "PerHeadRule": "multihead.step.trunk_rule",
    "HeadsPass": "multihead.step.trunk_rule",
    "PlannedUpdate": "multihead.step.applier",
    "copy_weights": "multihead.io.transfer",
    "load_data": "multihead.experiments.build.data_sources",
    "multidigits": "multihead.datasets.multidigits",
    "impressions": "multihead.datasets.impressions",
    "LoadedRun": "multihead.experiments.run.load",
    "load_run": "multihead.experiments.run.load",
    "run_experiment": "multihead.experiments.run.experiment",
    "RunResult": "multihead.experiments.run.experiment",
    "RunInputError": "multihead.experiments.run.resume",
    "Comparison": "multihead.experiments.results.compare",
    "compare": "multihead.experiments.results.compare",
}

if _TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from multihead.aggregation import AGGREGATORS
    from multihead.aggregation import LOSS_WEIGHTINGS
    from multihead.aggregation import Aggregation
    from multihead.aggregation import Aggregator
    from multihead.aggregation import Buffered
    from multihead.aggregation import BufferedAggregator
    from multihead.aggregation import CoordinatewiseAggregator
    from multihead.aggregation import GramianWeighting
    from multihead.aggregation import LossWeighting
    from multihead.aggregation import StatefulGramianWeighting
    from multihead.aggregation import StateSpec
    from multihead.aggregation import Weighting
    from multihead.aggregation import aggregate
    from multihead.io.checkpoint_file import CheckpointMismatchError
    from multihead.io.checkpoint_file import CheckpointReadError
    from multihead.io.best_checkpoint import BestCheckpoint
    from multihead.io.checkpoints import checkpoint_parts
    from multihead.io.checkpoints import restore_checkpoint
    from multihead.io.checkpoints import save_checkpoint
    from multihead.io.manager import CheckpointManager
    from multihead.io.checkpoint_parts import available_parts
    from multihead.training.callbacks import Callback
    from multihead.training.callbacks import EarlyStopping
    from multihead.training.head_early_stopping import HeadEarlyStopping
    from multihead.training.callbacks import LambdaCallback
    from multihead.training.callbacks import ReduceLROnPlateau
    from multihead.training.callbacks import TerminateOnNonFinite
    from multihead.datasets.multitask import MultiTaskData
    from multihead.datasets.multitask import as_dataset
    from multihead.training.streams import batches_per_epoch
    from multihead.datasets.multitask import mmoe_synthetic
    from multihead.step.distribute import make_strategy
    from multihead.io.export import ExportResult
    from multihead.io.export import export_saved_model
    from multihead.training.keras_model import MultiHeadModel
    from multihead.model.architectures import CGC
    from multihead.model.architectures import MMoE
    from multihead.model.architectures import MTAN
    from multihead.model.architectures import OMoE
    from multihead.model.architectures import PLE
    from multihead.model.architectures import CrossStitch
    from multihead.model.architectures import DSelectK
    from multihead.monitoring.monitor import Monitor
    from multihead.objectives.objective import Objective
    from multihead.step.loss_scales import DynamicLossScale
    from multihead.step.options import StepOptions
    from multihead.model.partition import Partition
    from multihead.monitoring.report import RunReport
    from multihead.monitoring.report import load_report
    from multihead.rl.replay import ReplayBuffer
    from multihead.rl.target_network import TargetNetwork
    from multihead.model.addresses import variable_addresses
    from multihead.io.tf1_import import ImportReport
    from multihead.io.tf1_import import import_tf1_checkpoint
    from multihead.training.sampling import TaskSampling
    from multihead.training.trainer import History
    from multihead.training.trainer import StepResult
    from multihead.settings import SettingError
    from multihead.training.training_state import TrainingState
    from multihead.training.trainer import Trainer
    from multihead.step.trunk_policy import TrunkPolicy
    from multihead.step.trunk_rule import TrunkRule
    from multihead.step.trunk_rule import PerHeadRule
    from multihead.step.trunk_rule import HeadsPass
    from multihead.step.applier import PlannedUpdate
    from multihead.io.transfer import copy_weights
    from multihead.experiments.build.data_sources import load_data
    from multihead.datasets.multidigits import multidigits
    from multihead.datasets.impressions import impressions
    from multihead.experiments.run.load import LoadedRun
    from multihead.experiments.run.load import load_run
    from multihead.experiments.run.experiment import RunResult
    from multihead.experiments.run.experiment import run_experiment
    from multihead.experiments.run.resume import RunInputError
    from multihead.experiments.results.compare import Comparison
    from multihead.experiments.results.compare import compare
    from multihead.monitoring.groupings import Grouping
    from multihead.monitoring.groupings import task_groupings


def __getattr__(name: str) -> _Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'multihead' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.1.0"

__all__ = [
    "AGGREGATORS",
    "Aggregation",
    "Aggregator",
    "Buffered",
    "BufferedAggregator",
    "CoordinatewiseAggregator",
    "GramianWeighting",
    "Grouping",
    "LOSS_WEIGHTINGS",
    "LossWeighting",
    "StateSpec",
    "StatefulGramianWeighting",
    "Weighting",
    "BestCheckpoint",
    "CGC",
    "Callback",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointReadError",
    "Comparison",
    "CrossStitch",
    "DSelectK",
    "DynamicLossScale",
    "EarlyStopping",
    "HeadEarlyStopping",
    "ExportResult",
    "HeadsPass",
    "History",
    "ImportReport",
    "LambdaCallback",
    "LoadedRun",
    "MMoE",
    "MTAN",
    "Monitor",
    "MultiHeadModel",
    "MultiTaskData",
    "OMoE",
    "Objective",
    "PLE",
    "Partition",
    "PerHeadRule",
    "PlannedUpdate",
    "ReduceLROnPlateau",
    "ReplayBuffer",
    "RunReport",
    "SettingError",
    "StepOptions",
    "StepResult",
    "TargetNetwork",
    "TaskSampling",
    "TerminateOnNonFinite",
    "Trainer",
    "TrainingState",
    "RunInputError",
    "RunResult",
    "TrunkPolicy",
    "TrunkRule",
    "__version__",
    "aggregate",
    "as_dataset",
    "batches_per_epoch",
    "available_parts",
    "checkpoint_parts",
    "compare",
    "copy_weights",
    "export_saved_model",
    "import_tf1_checkpoint",
    "impressions",
    "load_data",
    "load_report",
    "load_run",
    "make_strategy",
    "mmoe_synthetic",
    "multidigits",
    "restore_checkpoint",
    "run_experiment",
    "save_checkpoint",
    "task_groupings",
    "variable_addresses",
]
