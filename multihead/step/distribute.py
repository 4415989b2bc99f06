"""Scale-out through `tf.distribute`: strategy creation and the replica-side helpers of the step.

multihead never all-reduces on its own terms: gradients are summed by the
strategy's `ReplicaContext.all_reduce`, variables are `tf.distribute` mirrored
variables, and data is split by `Strategy.experimental_distribute_dataset`.

How a distributed step runs (`multihead.step.train_step.TrainStep` with `strategy=`):

1. In replica context (`strategy.run`), each replica takes the forward pass on
   its share of the global batch and each head's gradient of its objective
   scaled by `local batch / global batch` (what `tf.nn.compute_average_loss`
   does for a batch-mean loss), then all-reduces (sums) losses and gradients,
   once. The sum equals the single-device gradient of the global batch.
2. In cross-replica context (in the same compiled function, outside any
   `strategy.scope()`), every due head's optimizer applies the all-reduced
   gradients. There Keras' TF optimizer sees no replica context and does not
   all-reduce again; `tf.cond` for heads with `every > 1` is legal there (an
   optimizer's `merge_call` inside a `tf.cond` in replica context is not), and
   the monitor logs exactly the gradients applied.

Hence `Trainer.step` / `Trainer.fit` must be called outside `with strategy.scope():`
(build the model and optimizers inside it, train outside, as in Keras' custom
training loops).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any, Sequence

import tensorflow as tf

from multihead._checks import check_choice, variable_label

#: Values of the config key `distribute.strategy`.
STRATEGIES = ("none", "mirrored", "multi_worker")
#: `make_strategy`'s default `timeout_s` for a multi-worker collective (and heartbeat).
DEFAULT_TIMEOUT_S = 600.0


def make_strategy(kind: str = "none", devices: Sequence[str] | None = None,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S,
                  ) -> tf.distribute.Strategy | None:
    """A `tf.distribute` strategy, or None for single-device training.

    Example:
        >>> strategy = make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])  # doctest: +SKIP
        >>> with strategy.scope():                                             # doctest: +SKIP
        ...     model = build_model(); model.build((None, 10))
        >>> trainer = mh.Trainer(model, objectives, strategy=strategy)         # doctest: +SKIP

    Args:
        kind: `"none"`, `"mirrored"` (one machine, one replica per device) or
            `"multi_worker"` (`tf.distribute.MultiWorkerMirroredStrategy`; the
            cluster and this process's role come from the `TF_CONFIG`
            environment variable). Create a `multi_worker` strategy at program
            start, before any other TensorFlow work.
        devices: devices of a `mirrored` strategy (default: every GPU, else every
            logical CPU device, see `local_devices`).
        timeout_s: `multi_worker` only: a worker that waits longer than this for the
            others in one collective (an all-reduce) fails with `DeadlineExceededError`
            instead of waiting forever; it is also the coordination service's heartbeat
            timeout, after which a silent worker counts as failed, and the time this
            worker waits for the others to start (None: TensorFlow's defaults, no
            collective timeout, a 10 s heartbeat and an hour's wait at start-up).

    Raises:
        ValueError: unknown `kind`, `devices` given for another kind, a missing or
            malformed `TF_CONFIG` for `multi_worker`, or a worker that could not join
            its cluster (its port taken, or the others not started within `timeout_s`).
    """
    check_choice(kind, "distribute strategy", STRATEGIES)
    if devices is not None and kind != "mirrored":
        raise ValueError(f"distribute devices are only used with strategy 'mirrored', got "
                         f"devices={list(devices)!r} with strategy {kind!r}; remove devices")
    if kind == "none":
        return None
    if kind == "mirrored":
        if devices is not None:
            if isinstance(devices, str) or not devices:
                raise ValueError(f"distribute devices must be a non-empty list such as "
                                 f"['/gpu:0', '/gpu:1'], got {devices!r}")
            known = {_device_key(d.name) for d in tf.config.list_logical_devices()}
            for device in devices:
                if _device_key(device) not in known:
                    raise ValueError(f"distribute device {device!r} does not exist; this machine "
                                     f"has {[f'/{t.lower()}:{i}' for t, i in sorted(known)]}")
        else:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name for d in gpus or tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(list(devices))
    config = _tf_config()
    options = tf.distribute.experimental.CommunicationOptions()
    if timeout_s is not None:
        _configure_coordination(config, timeout_s)
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=float(timeout_s))
    task = config["task"]
    who = f"TF_CONFIG task {task['type']}:{task['index']} " \
          f"({config['cluster'][task['type']][int(task['index'])]})"
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except tf.errors.DeadlineExceededError:
        raise ValueError(f"{who} waited {timeout_s:g} s (distribute.timeout_s) for the other "
                         "workers of its cluster to start; are they all running?") from None
    except tf.errors.OpError as err:  # e.g. a busy port
        raise ValueError(f"{who} could not join its cluster: {type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0]}") from None


def _configure_coordination(config: dict[str, Any], timeout_s: float) -> None:
    """Sets the coordination service up as `MultiWorkerMirroredStrategy` would (it keeps a
    service configured before it), with `timeout_s` as the heartbeat timeout and as the
    time the workers wait for each other at start-up. On a loaded machine TensorFlow's
    10 s heartbeat let a busy but healthy worker be declared dead (measured on 2 shared
    cores), which aborted one worker and left the other waiting; and a worker whose
    peers never start waited an hour by default."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(config["cluster"][job]))
            for job in ("chief", "worker") if job in config["cluster"]]
    leader = "chief" if "chief" in config["cluster"] else "worker"
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=f"/job:{leader}/replica:0/task:0",
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(timeout_s * 1000),
        cluster_register_timeout_in_ms=int(timeout_s * 1000))
    # Registration waits at a barrier bounded by the timeout above; without it, the wait
    # for the other workers is the device-propagation barrier's fixed hour.
    context.context().coordination_service.cluster_register_with_barrier = True


def is_multi_worker(strategy: tf.distribute.Strategy | None) -> bool:
    """Whether `strategy` spans several processes (`MultiWorkerMirroredStrategy`)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _device_key(name: str) -> tuple[str, int]:
    """`("CPU", 0)` for `/cpu:0`, `/device:CPU:0` or `/job:localhost/.../device:CPU:0`."""
    try:
        spec = tf.DeviceSpec.from_string(name)
    except (ValueError, TypeError):
        raise ValueError(f"distribute device {name!r} is not a device name such as /gpu:0") from None
    return (spec.device_type or "").upper(), spec.device_index or 0


def _tf_config() -> dict[str, Any]:
    """The parsed `TF_CONFIG`, checked enough to fail with a clear message."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError(
            "distribute strategy 'multi_worker' needs the TF_CONFIG environment variable, e.g. "
            'TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
            '"task": {"type": "worker", "index": 0}}\' (see docs/distributed.md)')
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        kind, index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"TF_CONFIG is malformed ({type(err).__name__}: {err}); it needs "
                         "cluster.worker (a list of host:port) and task.type/task.index") from None
    roles = config["cluster"]
    if kind not in roles or not 0 <= index < len(roles[kind]):
        raise ValueError(f"TF_CONFIG task {kind}:{index} is not in its cluster {roles}")
    if not isinstance(workers, list) or not workers:
        raise ValueError(f"TF_CONFIG cluster.worker must be a non-empty list, got {workers!r}")
    return config


def is_chief(strategy: tf.distribute.Strategy | None) -> bool:
    """True if this process writes logs and checkpoints: always, except for the
    non-chief workers of a multi-worker strategy (the chief is task `chief:0`, or
    `worker:0` when the cluster has no chief)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    kind, index = resolver.task_type, resolver.task_id
    if kind == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return kind == "worker" and index == 0 and not has_chief


def scope(strategy: tf.distribute.Strategy | None) -> Any:
    """`strategy.scope()`, or a do-nothing context without a strategy."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def check_not_in_scope(strategy: tf.distribute.Strategy) -> None:
    """Training runs in cross-replica context outside `strategy.scope()` (see module doc)."""
    if tf.distribute.has_strategy():
        raise RuntimeError(
            "call Trainer.step / Trainer.fit outside `with strategy.scope():`; create the model "
            "and optimizers inside the scope and train outside it (as Keras custom loops do)")


def check_created_in_scope(strategy: tf.distribute.Strategy, variables: Sequence[Any],
                           what: str) -> None:
    """Raises if a variable of `what` was not created under `strategy.scope()`."""
    for v in variables:
        value = getattr(v, "value", v)
        if not strategy.extended.variable_created_in_scope(value):
            raise ValueError(
                f"{what}: variable {variable_label(v)!r} was not created under strategy.scope(); "
                "build the model (and create the optimizers and target networks) inside `with "
                "strategy.scope():`")


# -- inside the replica function -----------------------------------------------------------


def replica_share(inputs: Any) -> tf.Tensor:
    """`local batch size / global batch size` for this replica (float32, in replica context).

    A head's objective is a mean over the replica's examples; multiplied by this
    scale and summed over replicas it is the mean over the global batch, as
    `tf.nn.compute_average_loss(per_example, global_batch_size)` would give.
    Counting the global batch (rather than assuming equal shares) keeps a short
    last batch exact.
    """
    local = tf.cast(tf.shape(tf.nest.flatten(inputs)[0])[0], tf.float32)
    total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
    return local / total


def count_share(count: tf.Tensor) -> tf.Tensor:
    """`count / (count summed over replicas)` (0 when the sum is 0), in replica context.

    The scale of a head whose loss is a mean over its present labels (`count` of
    them on this replica): summed over replicas, each replica's mean times its share
    is the mean over the global batch's present labels.
    """
    total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, count)
    return tf.math.divide_no_nan(count, total)


def all_reduce_sum(values: Any) -> Any:
    """Sums a structure of tensors (None leaves kept) over replicas in one all-reduce."""
    flat = tf.nest.flatten(values, expand_composites=False)
    present = [i for i, v in enumerate(flat) if v is not None]
    dense = [tf.convert_to_tensor(flat[i]) for i in present]
    reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, dense)
    out = list(flat)
    for i, value in zip(present, reduced):
        out[i] = value
    return tf.nest.pack_sequence_as(values, out)


def first_replica(strategy: tf.distribute.Strategy, values: Any) -> Any:
    """The first local replica's copy of an all-reduced structure (identical on every replica)."""
    return tf.nest.map_structure(
        lambda v: None if v is None else strategy.experimental_local_results(v)[0], values)


# -- data ------------------------------------------------------------------------------------


def distribute_batch(strategy: tf.distribute.Strategy, batch: Any) -> Any:
    """Splits one global batch (arrays or tensors) along its first axis across the replicas.

    Every worker passes the same global batch; replica `i` of `R` takes rows
    `[i*n // R, (i+1)*n // R)`, so the replicas together see it exactly once.
    """
    batch = tf.nest.map_structure(tf.convert_to_tensor, batch)
    replicas = strategy.num_replicas_in_sync

    def share(context: tf.distribute.ValueContext) -> Any:
        i = context.replica_id_in_sync_group

        def rows(t: tf.Tensor) -> tf.Tensor:
            n = int(t.shape[0])
            return t[(i * n) // replicas:((i + 1) * n) // replicas]

        return tf.nest.map_structure(rows, batch)

    return strategy.experimental_distribute_values_from_function(share)


def local_devices(count: int = 2) -> None:
    """Splits the CPU into `count` logical devices (call before TensorFlow initialises).

    For trying `mirrored` on a machine without several GPUs: e.g. at the top of a
    script, `multihead.step.distribute.local_devices(2)`, then `make_strategy("mirrored")`
    finds `/cpu:0` and `/cpu:1`.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def local_workers(count: int = 2) -> list[str]:
    """`count` worker addresses on free ports of 127.0.0.1, for trying `multi_worker` with
    local processes: each gets `TF_CONFIG={"cluster": {"worker": addresses}, "task":
    {"type": "worker", "index": i}}`. The ports are free when this returns."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in socks]
    finally:
        for sock in socks:
            sock.close()
