"""Aggregation methods: how the heads' trunk gradients become one trunk update.

Each method is one class (options as constructor arguments, state declared by the method)
on a few public bases (`base`): `GramianWeighting` and `StatefulGramianWeighting`,
`CoordinatewiseAggregator`, `BufferedAggregator`, and `LossWeighting`. The built-ins are
listed by name in `registry`; `aggregate` runs any of them, or a user's, on an explicit
`K x D` matrix. This package imports nothing else of multihead.
"""

from multihead.aggregation._numerics import gramian
from multihead.aggregation.aligned_mtl import AlignedMTL
from multihead.aggregation.bargaining import FairGrad, NashMTL
from multihead.aggregation.base import (
    Aggregator,
    Buffered,
    BufferedAggregator,
    CoordinatewiseAggregator,
    GramianWeighting,
    StatefulGramianWeighting,
    StateSpec,
    Weighting,
)
from multihead.aggregation.buffered import DBMTL, ExcessMTL, MoCo
from multihead.aggregation.cagrad import CAGrad
from multihead.aggregation.conflict_free import ConFIG
from multihead.aggregation.constant import FixedWeights, Mean, RandomWeights, Sum
from multihead.aggregation.coordinatewise import GradDrop, TrimmedMean
from multihead.aggregation.dispatch import Aggregation, aggregate
from multihead.aggregation.gradvac import GradVac
from multihead.aggregation.imtl import IMTLG
from multihead.aggregation.krum import Krum
from multihead.aggregation.loss_weighting import (
    DWAWeighting,
    FAMOWeighting,
    GLSWeighting,
    GradNormWeighting,
    IMTLLWeighting,
    LossWeighting,
    RLWWeighting,
    STCHWeighting,
    UncertaintyWeighting,
)
from multihead.aggregation.mgda import EPO, MGDA
from multihead.aggregation.pcgrad import PCGrad
from multihead.aggregation.registry import (
    AGGREGATOR_CLASSES,
    AGGREGATORS,
    LOSS_WEIGHTING_CLASSES,
    LOSS_WEIGHTINGS,
    REP_GRAD_AGGREGATORS,
    STATEFUL_AGGREGATORS,
    get_aggregator,
    make_loss_weighting,
)
from multihead.aggregation.sdmgrad import SDMGrad
from multihead.aggregation.upgrad import DualProj, UPGrad

__all__ = [
    "AGGREGATORS", "AGGREGATOR_CLASSES", "Aggregation", "Aggregator", "AlignedMTL", "Buffered",
    "BufferedAggregator", "CAGrad", "ConFIG", "CoordinatewiseAggregator", "DBMTL", "DWAWeighting",
    "DualProj", "EPO", "ExcessMTL", "FAMOWeighting", "FairGrad", "FixedWeights", "GLSWeighting",
    "GradDrop", "GradNormWeighting", "GradVac", "GramianWeighting", "IMTLG", "IMTLLWeighting",
    "Krum", "LOSS_WEIGHTINGS", "LOSS_WEIGHTING_CLASSES", "LossWeighting", "MGDA", "Mean", "MoCo",
    "NashMTL", "PCGrad", "REP_GRAD_AGGREGATORS", "RLWWeighting", "RandomWeights", "SDMGrad",
    "STATEFUL_AGGREGATORS", "STCHWeighting", "StateSpec", "StatefulGramianWeighting", "Sum",
    "TrimmedMean", "UPGrad", "UncertaintyWeighting", "Weighting", "aggregate", "get_aggregator",
    "gramian", "make_loss_weighting",
]
