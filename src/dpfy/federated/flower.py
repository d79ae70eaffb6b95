"""DP-FedAvg on Flower (``flwr``): a dpfy server strategy, a client app, an in-process grid.

Flower's own DP wrappers clip and add noise but do not account ε over rounds with
subsampling. Here Flower moves the messages and dpfy does the privacy:

- :class:`DPFedAvgStrategy` (a Flower message-API ``Strategy``) wraps a
  :class:`~dpfy.federated.server.DPFedAvgServer`: ``configure_train`` asks dpfy's Poisson
  sampler which users take part in the round (never Flower's node sampling) and sends them
  the global model, the round's clip C_t and the local training settings; ``aggregate_train``
  runs the clipping check, adds the noise once, records the round in the ledger and applies
  the server update. Client-side evaluation is switched off: a metric computed on a user's
  private data and sent back would be a release the ledger does not hold; evaluate on
  public or held-out server data with ``Strategy.start(evaluate_fn=...)``.
- :func:`make_client_app` builds a Flower ``ClientApp`` whose ``train`` handler is dpfy's
  client step (local SGD from the global model, the delta clipped to C_t); its reply holds
  the clipped delta and the delta's norm before clipping (which only the quantile method's
  noisy count reads).
- :class:`InProcessGrid` delivers messages to a ``ClientApp`` in this process, one node per
  user, each message's records serialised to Flower's protobuf wire format and back. Flower's
  simulation engine needs Ray (``flwr[simulation]``), which dpfy does not require; this grid
  runs Flower's own strategy loop (``Strategy.start``), message objects and ``ClientApp``
  dispatch without it. With a SuperLink and SuperNodes the same strategy and client app run
  unchanged (``ServerApp``/``ClientApp``), the grid then being Flower's.

Users are Flower nodes: user u is the u-th node id in sorted order; the number of nodes must
stay N_users (the population the sampler draws from), else the round is refused.

Needs the ``fl`` extra: ``pip install 'dpfy[fl]'`` (flwr 1.42).
"""

from __future__ import annotations

import itertools
import uuid
from logging import INFO
from typing import Any, Callable, Iterable, TypeVar, cast

import torch
from torch import nn

try:
    from flwr.app import (
        ArrayRecord,
        ConfigRecord,
        Context,
        Error,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )
    from flwr.clientapp import ClientApp
    from flwr.common import serde
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Strategy
    from flwr.supercore import log
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"dpfy.federated.flower needs Flower (flwr), which is not installed ({err}). "
        f"Install the extra: pip install 'dpfy[fl]'"
    ) from err

from dpfy._require import require
from dpfy.adaptive.base import method_name
from dpfy.errors import PrivacyRefusal
from dpfy.federated.local import (
    LocalTraining,
    LossFn,
    local_generator,
    local_seed,
    user_contribution,
)
from dpfy.federated.server import USER_UNIT, Contribution, DPFedAvgServer

__all__ = [
    "DPFedAvgStrategy",
    "make_client_app",
    "InProcessGrid",
    "run_flower",
    "ARRAYS",
    "CONFIG",
    "METRICS",
    "DELTA_NORM",
]

ARRAYS, CONFIG, METRICS = "arrays", "config", "metrics"  # the records of a message
DELTA_NORM = "delta-norm"  # ‖Δ_u‖ before clipping

_R = TypeVar("_R", ArrayRecord, MetricRecord, ConfigRecord)


def _record(content: RecordDict, key: str, kind: type[_R]) -> _R:
    """The record ``key`` of a message's content, of the kind dpfy puts there."""
    record = content[key]
    if not isinstance(record, kind):
        raise TypeError(
            f"a message's {key!r} record must be a {kind.__name__}, got {type(record).__name__}"
        )
    return record


def _number(record: MetricRecord | ConfigRecord, key: str) -> int | float:
    """The value ``key`` of a record, a number as dpfy sends it (Flower's records also hold
    lists, strings and bytes)."""
    value = record[key]
    if not isinstance(value, (int, float)):
        raise TypeError(f"a message's {key!r} must be a number, got {type(value).__name__}")
    return value


class DPFedAvgStrategy(Strategy):
    """Flower strategy running dpfy's DP-FedAvg server (module docstring).

    Args:
      server: the dpfy server (sampler, noise, ledger, global model, method).
      training: the local training every sampled user runs (sent each round).
      local_seed: seeds each user's local minibatch order (None: data order).
    """

    def __init__(
        self, server: DPFedAvgServer, training: LocalTraining, *, local_seed: int | None = None
    ) -> None:
        self.server, self.training, self.local_seed = server, training, local_seed
        self._nodes: list[int] = []

    def _users_as_nodes(self, grid: Grid) -> list[int]:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) != self.server.num_users:
            raise PrivacyRefusal(
                f"the Flower nodes must be the server's {self.server.num_users} users, got "
                f"{len(nodes)} nodes. The sampler's rate q_u is over a fixed population; "
                f"build the server with num_users = the number of nodes"
            )
        return nodes

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample the round's users with dpfy's sampler; send each the model and C_t.

        ``arrays`` (the initial model in round 1, then what ``aggregate_train`` returned) are
        loaded into the server's model first: they are public values."""
        self._nodes = self._users_as_nodes(grid)
        self.server.model.load_state_dict(arrays.to_torch_state_dict())
        rp = self.server.begin_round()
        log(
            INFO,
            "dpfy configure_train: round %s, %s users sampled (q_u = %g), C = %.4g",
            server_round,
            len(rp.users),
            self.server.user_sample_rate,
            rp.clip,
        )
        model = ArrayRecord(self.server.model.state_dict())
        messages = []
        for u in rp.users:
            cfg = ConfigRecord(
                {
                    **dict(config),
                    "server-round": server_round,
                    "clip": rp.clip,
                    **self.training.to_config(),
                }
            )
            seed = local_seed(self.local_seed, rp.round, u)
            if seed is not None:
                cfg["local-seed"] = seed
            messages.append(
                Message(
                    content=RecordDict({ARRAYS: model, CONFIG: cfg}),
                    message_type=MessageType.TRAIN,
                    dst_node_id=self._nodes[u],
                )
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The clipping check, the noise (once), the ledger, the server update."""
        contributions, dropped = [], 0
        user_of = {n: u for u, n in enumerate(self._nodes)}
        for reply in replies:
            if reply.has_error():
                dropped += 1  # a sampled user who did not answer contributes 0
                continue
            node = int(reply.metadata.src_node_id)
            require(node in user_of, "a reply's node", node, "one of the round's nodes")
            content = reply.content
            contributions.append(
                Contribution(
                    user=user_of[node],
                    clipped=_record(content, ARRAYS, ArrayRecord).to_torch_state_dict(),
                    norm=float(_number(_record(content, METRICS, MetricRecord), DELTA_NORM)),
                )
            )
        result = self.server.finish_round(contributions)
        metrics = MetricRecord(
            {
                "users": result.num_users,
                "dropped": dropped,
                "clip": result.clip,
                "noise-multiplier": result.noise_multiplier,
            }
        )
        return ArrayRecord(self.server.model.state_dict()), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """None: a metric on a user's data would be an unaccounted release (evaluate_fn)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        s = self.server
        log(
            INFO,
            "\t├── dpfy DP-FedAvg: %s users, q_u = %g, σ = %.4g, C = %s, method = %s",
            s.num_users,
            s.user_sample_rate,
            s.noise_multiplier,
            s.clip,
            None if s.method is None else method_name(s.method),
        )
        log(INFO, f"\t└── unit of privacy: {USER_UNIT}; ledger: dpfy")


def make_client_app(
    model_fn: Callable[[], nn.Module],
    user_data: Callable[[Context], tuple[torch.Tensor, torch.Tensor]],
    loss_fn: LossFn,
) -> ClientApp:
    """A Flower ``ClientApp`` whose train handler is dpfy's client step.

    Args:
      model_fn: builds the model (its weights are replaced by the global model's).
      user_data: this node's user's examples (x_u, y_u), from the node's ``Context``
        (e.g. its ``node_config["partition-id"]``).
      loss_fn: the local loss (mean over a minibatch).
    """
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = model_fn()
        model.load_state_dict(_record(msg.content, ARRAYS, ArrayRecord).to_torch_state_dict())
        cfg = _record(msg.content, CONFIG, ConfigRecord)
        x, y = user_data(context)
        seed = int(_number(cfg, "local-seed")) if "local-seed" in cfg else None
        clipped, norm = user_contribution(
            model,
            x,
            y,
            loss_fn,
            LocalTraining.from_config(cfg),
            float(_number(cfg, "clip")),
            generator=local_generator(seed),
        )
        return Message(
            RecordDict({ARRAYS: ArrayRecord(clipped), METRICS: MetricRecord({DELTA_NORM: norm})}),
            reply_to=msg,
        )

    return app


def _over_the_wire(content: RecordDict) -> RecordDict:
    """``content`` serialised to Flower's protobuf bytes and parsed back (what a transport
    does), so nothing but the message's records crosses from server to client."""
    raw = serde.recorddict_to_proto(content).SerializeToString()
    proto = ProtoRecordDict()
    proto.ParseFromString(raw)
    return serde.recorddict_from_proto(proto)


class InProcessGrid(Grid):
    """A Flower ``Grid`` that runs a ``ClientApp`` in this process, one node per user.

    Node ids are 1 + partition id (node u+1 holds partition u, told to the client app in
    ``node_config["partition-id"]``). Each message's records go through Flower's wire format
    (:func:`_over_the_wire`); replies come back the same way. Messages are answered in order,
    synchronously; a client that raises is answered with an error reply (a dropped user).
    Flower's ``Message`` reads the sender's identity from the process-wide ``TaskIdentity``;
    the grid sets it to the server's (node 1) and switches it to the node's while a client
    runs, as Flower's own server and client processes do.
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, *, run_id: int = 1) -> None:
        require(num_nodes >= 1, "num_nodes", num_nodes, ">= 1")
        self.client_app = client_app
        self._run = Run.create_empty(run_id)
        self._contexts = {
            p + 1: Context(
                run_id=run_id,
                node_id=p + 1,
                node_config={"partition-id": p, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for p in range(num_nodes)
        }
        self._replies: dict[str, Message] = {}
        self._task_ids = itertools.count(2)
        self._as_server()

    def _as_server(self) -> None:
        TaskIdentity.task_id, TaskIdentity.run_id = 1, self._run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def _deliver(self, msg: Message) -> Message:
        node = msg.metadata.dst_node_id
        require(
            node in self._contexts,
            "a message's dst_node_id",
            node,
            f"one of the grid's nodes 1..{len(self._contexts)}",
        )
        # flwr's Message overloads omit the (metadata=, content=) form its __init__ accepts
        incoming: Message = cast(Any, Message)(
            metadata=msg.metadata, content=_over_the_wire(msg.content)
        )
        TaskIdentity.task_id, TaskIdentity.node_id = next(self._task_ids), node
        try:
            reply = self.client_app(incoming, self._contexts[node])
        except Exception as err:  # a failed client is a dropped user, as on a real grid
            log(INFO, "InProcessGrid: node %s failed (%s: %s)", node, type(err).__name__, err)
            self._as_server()
            return Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=incoming)
        finally:
            self._as_server()
        if reply.has_error():
            return reply
        return cast(Any, Message)(
            metadata=reply.metadata,  # as in the call above
            content=_over_the_wire(reply.content),
        )

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self._replies[msg.metadata.message_id] = self._deliver(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(list(self.push_messages(messages)))


def run_flower(strategy: DPFedAvgStrategy, client_app: ClientApp, rounds: int, **start: Any):
    """Run ``rounds`` rounds of ``strategy`` with ``client_app`` on an :class:`InProcessGrid`
    of N_users nodes, through Flower's ``Strategy.start``; returns Flower's ``Result``."""
    grid = InProcessGrid(client_app, strategy.server.num_users)
    return strategy.start(
        grid, ArrayRecord(strategy.server.model.state_dict()), num_rounds=rounds, **start
    )
