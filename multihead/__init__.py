"""multihead: a shared trunk, several heads, one loss and one optimizer per head.

Each head's optimizer is built on exactly the trunk's variables plus that
head's own, and per-head training is visible in TensorBoard.
"""

import os as _os

# TensorFlow's C++ start-up chatter (CUDA probing, oneDNN notices) hides real output.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from multihead.aggregation.aggregators import AGGREGATORS, Aggregation, aggregate  # noqa: E402
from multihead.io.checkpoint_file import CheckpointMismatchError, CheckpointReadError  # noqa: E402
from multihead.io.best_checkpoint import BestCheckpoint  # noqa: E402
from multihead.io.checkpoints import checkpoint_parts, restore_checkpoint, save_checkpoint  # noqa: E402
from multihead.io.manager import CheckpointManager  # noqa: E402
from multihead.io.parts import available_parts  # noqa: E402
from multihead.core.callbacks import (  # noqa: E402
    Callback,
    EarlyStopping,
    LambdaCallback,
    ReduceLROnPlateau,
    TerminateOnNonFinite,
)
from multihead.core.data import MultiTaskData, as_dataset, mmoe_synthetic  # noqa: E402
from multihead.core.distribute import make_strategy  # noqa: E402
from multihead.io.export import ExportResult, export_saved_model  # noqa: E402
from multihead.core.model import MultiHeadModel  # noqa: E402
from multihead.core.architectures import (  # noqa: E402
    CGC, MMoE, MTAN, OMoE, PLE, CrossStitch, DSelectK,
)
from multihead.monitoring.monitor import Monitor  # noqa: E402
from multihead.core.objectives import Objective  # noqa: E402
from multihead.core.partition import Partition  # noqa: E402
from multihead.monitoring.report import RunReport, load_report  # noqa: E402
from multihead.rl.replay import ReplayBuffer  # noqa: E402
from multihead.rl.target_network import TargetNetwork  # noqa: E402
from multihead.core.addresses import variable_addresses  # noqa: E402
from multihead.io.tf1_import import ImportReport, import_tf1_checkpoint  # noqa: E402
from multihead.core.sampling import TaskSampling  # noqa: E402
from multihead.core.trainer import History, StepResult, Trainer  # noqa: E402
from multihead.core.rules import SettingError  # noqa: E402
from multihead.core.training_state import TrainingState  # noqa: E402
from multihead.core.trunk_update import TrunkPolicy  # noqa: E402
from multihead.io.transfer import copy_weights  # noqa: E402
from multihead.experiments.data_sources import load_data  # noqa: E402
from multihead.experiments.multidigits import multidigits  # noqa: E402
from multihead.experiments.runs import LoadedRun, load_run  # noqa: E402
from multihead.experiments.compare import Comparison, compare  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AGGREGATORS",
    "Aggregation",
    "BestCheckpoint",
    "CGC",
    "Callback",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointReadError",
    "Comparison",
    "CrossStitch",
    "DSelectK",
    "EarlyStopping",
    "ExportResult",
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
    "ReduceLROnPlateau",
    "ReplayBuffer",
    "RunReport",
    "SettingError",
    "StepResult",
    "TargetNetwork",
    "TaskSampling",
    "TerminateOnNonFinite",
    "Trainer",
    "TrainingState",
    "TrunkPolicy",
    "__version__",
    "aggregate",
    "as_dataset",
    "available_parts",
    "checkpoint_parts",
    "compare",
    "copy_weights",
    "export_saved_model",
    "import_tf1_checkpoint",
    "load_data",
    "load_report",
    "load_run",
    "make_strategy",
    "mmoe_synthetic",
    "multidigits",
    "restore_checkpoint",
    "save_checkpoint",
    "variable_addresses",
]
