"""The TensorBoard tag schema: every tag multihead writes is built here, and read back here.

Tags are `kind/head/...`, so TensorBoard's Scalars page has one section per kind
with one card per head. A pair of heads is always `<a>/<b>`, `a` before `b` in
head order (head names hold no `/`, so the pair splits unambiguously), except
`affinity/<i>/<j>`, which is directed: the affinity of head i onto head j (i = j too). Variables
are named by their stable address (`trunk/0/kernel`, `heads/a/bias`, see
`multihead.model.addresses`), so two builds of one architecture write the same tags.

Train run (`<log_dir>/train`):

| tag                                   | value                                                  |
|---------------------------------------|--------------------------------------------------------|
| `loss/<head>`                         | the head's loss (unweighted, without regularization)   |
| `grad_norm/<head>/trunk`, `/head`     | L2 norm of the applied gradient's trunk / head part    |
| `grad_norm/<head>/var/<address>`      | one variable's gradient norm                           |
| `grad_norm/<head>/part/heads/<h>`     | head h's part, for an objective that trains >1 head    |
| `grad_norm_clipped/<head>/trunk`      | the trunk part's norm after clipping                   |
| `grad_hist/<head>/<address>`          | one variable's gradient histogram                      |
| `lr/<head>`                           | the learning rate of the update                        |
| `update_ratio/<head>`                 | norm of the update / norm of the weights before it     |
| `loss_weight/<head>`                  | the weight the head's loss was scaled by               |
| `nonfinite_skips/<head>`              | updates skipped for a non-finite loss or gradient      |
| `missing_label_skips/<head>`          | due steps skipped: no row of the batch had a label     |
| `loss_scale/<head>`                   | the head's dynamic loss scale after the step (float16) |
| `grad_cosine/<a>/<b>`                 | cosine of a's and b's trunk gradients                  |
| `affinity/<i>/<j>`                    | inter-task affinity of head i onto head j (ordered)    |
| `agg_weight/<head>`                   | the aggregator's weight of the head's trunk gradient   |
| `agg_loss_weight/<head>`              | a loss weighting's weight of the head's loss           |
| `agg_trunk_grad_norm/<head>`          | norm of the head's trunk gradient fed to the aggregator|
| `agg_cosine/<a>/<b>`                  | cosine of a's and b's gradients fed to the aggregator  |
| `agg_projections`, `agg_update_norm`  | PCGrad projections; norm of the aggregated update      |
| `gate/<head>/expert_<i>`              | mean weight the head's gate gives expert i (batch mean)|
| `gate/<head>/entropy`                 | mean entropy of the head's gate weights (nats)         |
| `gate_hist/<head>`                    | histogram of the head's gate weights (all experts)     |
| `episode/return`, `episode/length`    | RL episodes, x axis = environment steps                |
| `config` (text)                       | the resolved experiment config                         |
| `trunk_blocks` (text)                 | with trunk taps: the trunk blocks each head trains     |

Eval run (`<log_dir>/eval`): `<metric>/<head>` (`loss/a`, `mae/a`), and the
episode tags.
"""

from __future__ import annotations

from typing import NamedTuple

LOSS = "loss"
GRAD_NORM = "grad_norm"
GRAD_NORM_CLIPPED = "grad_norm_clipped"
GRAD_HIST = "grad_hist"
LR = "lr"
UPDATE_RATIO = "update_ratio"
LOSS_WEIGHT = "loss_weight"
NONFINITE_SKIPS = "nonfinite_skips"
MISSING_LABEL_SKIPS = "missing_label_skips"
LOSS_SCALE = "loss_scale"
GRAD_COSINE = "grad_cosine"
AFFINITY = "affinity"
AGG_WEIGHT = "agg_weight"
AGG_LOSS_WEIGHT = "agg_loss_weight"
AGG_TRUNK_GRAD_NORM = "agg_trunk_grad_norm"
AGG_COSINE = "agg_cosine"
AGG_PROJECTIONS = "agg_projections"
AGG_UPDATE_NORM = "agg_update_norm"
EPISODE_RETURN = "episode/return"
EPISODE_LENGTH = "episode/length"
CONFIG = "config"
TRUNK_BLOCKS = "trunk_blocks"
GATE = "gate"
GATE_HIST = "gate_hist"
#: The last segment of a gate's entropy tag; an expert's is `expert_<i>`.
GATE_ENTROPY, GATE_EXPERT = "entropy", "expert_"

#: The parts a head's gradient norm is split into.
TRUNK, HEAD, VAR, PART = "trunk", "head", "var", "part"

_PER_HEAD = (LOSS, LR, UPDATE_RATIO, LOSS_WEIGHT, NONFINITE_SKIPS, MISSING_LABEL_SKIPS, LOSS_SCALE,
             AGG_WEIGHT, AGG_LOSS_WEIGHT, AGG_TRUNK_GRAD_NORM)
_PAIRS = (GRAD_COSINE, AGG_COSINE, AFFINITY)
_RUN_WIDE = (AGG_PROJECTIONS, AGG_UPDATE_NORM, CONFIG, TRUNK_BLOCKS, EPISODE_RETURN,
             EPISODE_LENGTH)


# -- building --------------------------------------------------------------------------


def loss(head: str) -> str:
    """`loss/<head>`."""
    return f"{LOSS}/{head}"


def trunk_grad_norm(head: str) -> str:
    """`grad_norm/<head>/trunk`."""
    return f"{GRAD_NORM}/{head}/{TRUNK}"


def head_grad_norm(head: str) -> str:
    """`grad_norm/<head>/head`."""
    return f"{GRAD_NORM}/{head}/{HEAD}"


def variable_grad_norm(head: str, address: str) -> str:
    """`grad_norm/<head>/var/<address>`."""
    return f"{GRAD_NORM}/{head}/{VAR}/{address}"


def part_grad_norm(head: str, part: str) -> str:
    """`grad_norm/<head>/part/<part>` (`part`: `heads/<name>`)."""
    return f"{GRAD_NORM}/{head}/{PART}/{part}"


def grad_norm_clipped(head: str) -> str:
    """`grad_norm_clipped/<head>/trunk`."""
    return f"{GRAD_NORM_CLIPPED}/{head}/{TRUNK}"


def grad_hist(head: str, address: str) -> str:
    """`grad_hist/<head>/<address>`."""
    return f"{GRAD_HIST}/{head}/{address}"


def lr(head: str) -> str:
    """`lr/<head>`."""
    return f"{LR}/{head}"


def update_ratio(head: str) -> str:
    """`update_ratio/<head>`."""
    return f"{UPDATE_RATIO}/{head}"


def loss_weight(head: str) -> str:
    """`loss_weight/<head>`."""
    return f"{LOSS_WEIGHT}/{head}"


def nonfinite_skips(head: str) -> str:
    """`nonfinite_skips/<head>`."""
    return f"{NONFINITE_SKIPS}/{head}"


def missing_label_skips(head: str) -> str:
    """`missing_label_skips/<head>`."""
    return f"{MISSING_LABEL_SKIPS}/{head}"


def loss_scale(head: str) -> str:
    """`loss_scale/<head>`."""
    return f"{LOSS_SCALE}/{head}"


def grad_cosine(a: str, b: str) -> str:
    """`grad_cosine/<a>/<b>`; the writer passes `a` before `b` in head order."""
    return f"{GRAD_COSINE}/{a}/{b}"


def affinity(source: str, target: str) -> str:
    """`affinity/<i>/<j>`: the affinity of head `source` (i) onto head `target` (j), directed
    (`multihead.step.affinity`)."""
    return f"{AFFINITY}/{source}/{target}"


def agg_weight(head: str) -> str:
    """`agg_weight/<head>`."""
    return f"{AGG_WEIGHT}/{head}"


def agg_loss_weight(head: str) -> str:
    """`agg_loss_weight/<head>`."""
    return f"{AGG_LOSS_WEIGHT}/{head}"


def agg_trunk_grad_norm(head: str) -> str:
    """`agg_trunk_grad_norm/<head>`."""
    return f"{AGG_TRUNK_GRAD_NORM}/{head}"


def agg_cosine(a: str, b: str) -> str:
    """`agg_cosine/<a>/<b>`, the same pair format as `grad_cosine`."""
    return f"{AGG_COSINE}/{a}/{b}"


def gate_expert(head: str, expert: int) -> str:
    """`gate/<head>/expert_<i>`: the mean weight the head's gate gives expert i."""
    return f"{GATE}/{head}/{GATE_EXPERT}{expert}"


def gate_entropy(head: str) -> str:
    """`gate/<head>/entropy`: the mean entropy of the head's gate weights."""
    return f"{GATE}/{head}/{GATE_ENTROPY}"


def gate_hist(head: str) -> str:
    """`gate_hist/<head>`: histogram of the head's gate weights."""
    return f"{GATE_HIST}/{head}"


def eval_metric(metric: str, head: str) -> str:
    """`<metric>/<head>` in the eval run (`loss/a`, `mae/a`)."""
    return f"{metric}/{head}"


# -- reading ---------------------------------------------------------------------------


class Tag(NamedTuple):
    """A train-run tag split into its parts.

    Attributes:
        kind: the first segment (`loss`, `grad_norm`, `grad_cosine`, ...), or the
            whole tag of a run-wide one (`agg_projections`, `episode/return`).
        heads: the head (one), the pair (two), or `()` for a run-wide tag.
        part: `trunk`, `head`, `var` or `part` for gradient norms, `expert_<i>` or `entropy`
            for gate tags, else None.
        address: the variable's address for per-variable tags, the part's (`heads/<h>`)
            for per-part ones, else None.
    """

    kind: str
    heads: tuple[str, ...] = ()
    part: str | None = None
    address: str | None = None


def parse(tag: str) -> Tag | None:
    """The parts of a train-run tag of this schema, or None for any other tag.

    Example:
        >>> parse("grad_norm/a/var/trunk/0/kernel")
        Tag(kind='grad_norm', heads=('a',), part='var', address='trunk/0/kernel')
        >>> parse("agg_cosine/a/b")
        Tag(kind='agg_cosine', heads=('a', 'b'), part=None, address=None)
    """
    if tag in _RUN_WIDE:
        return Tag(tag)
    kind, _, rest = tag.partition("/")
    segments = rest.split("/") if rest else []
    if not segments or not all(segments):
        return None
    if kind in _PER_HEAD and len(segments) == 1:
        return Tag(kind, (segments[0],))
    if kind in _PAIRS and len(segments) == 2:
        return Tag(kind, (segments[0], segments[1]))
    if kind == GRAD_NORM:
        if len(segments) == 2 and segments[1] in (TRUNK, HEAD):
            return Tag(kind, (segments[0],), segments[1])
        if len(segments) > 2 and segments[1] in (VAR, PART):
            return Tag(kind, (segments[0],), segments[1], "/".join(segments[2:]))
        return None
    if kind == GRAD_NORM_CLIPPED and segments[1:] == [TRUNK]:
        return Tag(kind, (segments[0],), TRUNK)
    if kind == GATE and len(segments) == 2 and (
            segments[1] == GATE_ENTROPY
            or (segments[1].startswith(GATE_EXPERT) and segments[1][len(GATE_EXPERT):].isdigit())):
        return Tag(kind, (segments[0],), segments[1])
    if kind == GATE_HIST and len(segments) == 1:
        return Tag(kind, (segments[0],))
    if kind == GRAD_HIST and len(segments) > 1:
        return Tag(kind, (segments[0],), None, "/".join(segments[1:]))
    return None
