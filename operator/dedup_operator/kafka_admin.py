"""The operator's calls to Kafka's admin API: the topics' facts that `topics.check_topics`
decides on, and the internal topic created and deleted. What Kafka refuses comes back as
a value (`TopicCheck` KafkaUnreachable, or Kafka's error text).

The topics' checks of every pipeline on one Kafka cluster with the same client settings
share one AdminClient (`SharedAdmins`): a check on a client of its own cost a connection
(and, with TLS or SASL, a handshake) and ~5 ms of CPU, ~1.6 ms on a connected one, and
at 100 pipelines a check comes every 0.3 s. A shared client unused for `IDLE_S` is
closed, and one whose metadata request failed is dropped at once: in an outage each
check opens a client of its own and tells KafkaUnreachable, as before. The internal
topic's creation and deletion (once in a pipeline's life) open a client of their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from dedup_contract import broker_logs
from dedup_operator.topics import (
    INPUT_CONFIGS,
    OUTPUT_CONFIGS,
    OWNED_CONFIGS,
    OwnedTopicSettings,
    TopicCheck,
    TopicFacts,
)

IDLE_S = 10.0
"""A shared admin client unused this long is closed: the client of settings no longer
used (a pipeline deleted, its credentials rotated) does not stay open, and a single
pipeline (a check every topic_check_s) gets a client per check, as before."""


@dataclass
class _Shared:
    admin: AdminClient
    log: broker_logs.ConnectionLog
    used: float  # monotonic: when last taken
    users: int = 0  # checks using it now: not closed under them


_Key = tuple[str, tuple[tuple[str, str], ...]]


class SharedAdmins:
    """One AdminClient per (bootstrap, client settings), shared by the checks of every
    pipeline that has them; thread-safe (passes run on a pool; librdkafka's handle is
    thread-safe). `open_client` makes a client with its log hook (a stand-in in unit
    tests)."""

    def __init__(
        self,
        open_client: Callable[[str, Mapping[str, str], broker_logs.ConnectionLog], AdminClient]
        | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        idle_s: float = IDLE_S,
    ) -> None:
        self._open = open_client or _open_admin
        self._monotonic = monotonic
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._clients: dict[_Key, _Shared] = {}
        self._sweeper: threading.Thread | None = None
        self.opened = 0  # clients made (read by tests)

    @staticmethod
    def _key(bootstrap: str, settings: Mapping[str, str]) -> _Key:
        return bootstrap, tuple(sorted((str(k), str(v)) for k, v in settings.items()))

    def take(self, bootstrap: str, settings: Mapping[str, str]) -> _Shared:
        """The shared client for these settings (made when there is none), marked in use
        until `give_back`."""
        key = self._key(bootstrap, settings)
        with self._lock:
            shared = self._clients.get(key)
            if shared is None:
                log = broker_logs.ConnectionLog()
                shared = _Shared(self._open(bootstrap, settings, log), log, 0.0)
                self._clients[key] = shared
                self.opened += 1
            shared.users += 1
            shared.used = self._monotonic()
        return shared

    def give_back(
        self, bootstrap: str, settings: Mapping[str, str], shared: _Shared, *, failed: bool
    ) -> None:
        """A check done with `shared`; `failed` (Kafka not reached): the client is dropped,
        and the next check opens a new one."""
        key = self._key(bootstrap, settings)
        with self._lock:
            shared.users -= 1
            shared.used = self._monotonic()
            if failed and self._clients.get(key) is shared:
                del self._clients[key]
        if not failed:
            shared.log.request_succeeded()
        self._start_sweeper()

    def sweep(self) -> int:
        """Close the clients idle for `idle_s` (none in use); how many were closed."""
        now = self._monotonic()
        with self._lock:
            idle = [
                key
                for key, shared in self._clients.items()
                if shared.users == 0 and now - shared.used >= self.idle_s
            ]
            closed = [self._clients.pop(key) for key in idle]
        del closed  # the last reference: librdkafka's handle is destroyed here
        return len(idle)

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    def _start_sweeper(self) -> None:
        with self._lock:
            if self._sweeper is not None:
                return
            self._sweeper = threading.Thread(
                target=self._sweep_forever, name="kafka-admin-sweeper", daemon=True
            )
        self._sweeper.start()

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(self.idle_s / 4)
            self.sweep()


def _open_admin(
    bootstrap: str, settings: Mapping[str, str], log: broker_logs.ConnectionLog
) -> AdminClient:
    # librdkafka's lines through logging (JSON, not raw `%3|...|FAIL|` on stderr), a
    # failed connection at WARNING: a client of 5 s (or idle for IDLE_S) never sees all
    # brokers down for 30 s; an unreachable Kafka is the TopicReady condition's ERROR line
    return AdminClient({"bootstrap.servers": bootstrap, **settings, "logger": log})


def _admin(bootstrap: str, settings: Mapping[str, str]) -> AdminClient:
    """A client of its own (the internal topic's creation and deletion)."""
    return _open_admin(bootstrap, settings, broker_logs.ConnectionLog())


SHARED_ADMINS = SharedAdmins()
"""The operator's shared admin clients (one process, one set)."""


def read_topics(
    bootstrap: str,
    settings: Mapping[str, str],
    input_topic: str,
    output_topic: str,
    owned_topic: str | None = None,
    timeout_s: float = 5.0,
    owned_user_named: bool = False,
    admins: SharedAdmins = SHARED_ADMINS,
) -> TopicFacts | TopicCheck:
    """The input, output (and internal, when `owned_topic` is given) topics' partition
    counts, replication and configs (what `topics.check_topics` decides on), or
    KafkaUnreachable; read through the shared client for these settings."""
    shared = admins.take(bootstrap, settings)
    facts: TopicFacts | TopicCheck | None = None
    try:
        facts = _read_topics(
            shared.admin,
            input_topic,
            output_topic,
            owned_topic,
            timeout_s,
            owned_user_named,
        )
    finally:
        unreached = isinstance(facts, TopicCheck) and facts.reason == "KafkaUnreachable"
        admins.give_back(bootstrap, settings, shared, failed=facts is None or unreached)
    return facts


def _read_topics(
    admin: AdminClient,
    input_topic: str,
    output_topic: str,
    owned_topic: str | None,
    timeout_s: float,
    owned_user_named: bool,
) -> TopicFacts | TopicCheck:
    # every topic's metadata in one request, not the cluster's (which grows with every topic)
    try:
        described = _describe(admin, [input_topic, output_topic, owned_topic], timeout_s)
    except (KafkaException, TimeoutError) as exc:
        return TopicCheck(
            False, "KafkaUnreachable", f"cannot read metadata of {input_topic}: {exc}"
        )
    inputs, _, why = described[input_topic]
    outputs, output_replication, _ = described[output_topic]
    owned = described[owned_topic] if owned_topic is not None else (None, None, "")

    # every topic's configs in one DescribeConfigs request (one future per topic)
    asked = {
        "output": (output_topic, OUTPUT_CONFIGS, outputs is not None),
        "input": (input_topic, INPUT_CONFIGS, owned_topic is not None and inputs is not None),
        "owned": (
            owned_topic or "",
            OWNED_CONFIGS,
            owned_topic is not None and owned[0] is not None,
        ),
    }
    wanted: dict[str, list[str]] = {}
    for topic, keys, ask in asked.values():
        if ask:
            wanted.setdefault(topic, []).extend(keys)
    read = _configs(admin, wanted, timeout_s)

    def of(role: str) -> tuple[dict[str, str], str | None]:
        topic, keys, ask = asked[role]
        if not ask:
            return {}, None
        values, error = read[topic]
        return {k: v for k, v in values.items() if k in keys}, error

    output_config, output_error = of("output")
    input_config, input_error = of("input")
    owned_config, owned_error = of("owned")
    return TopicFacts(
        input_topic,
        inputs,
        output_topic,
        outputs,
        output_config,
        why,
        output_error,
        output_replication=output_replication,
        input_config=input_config,
        input_config_error=input_error,
        owned_topic=owned_topic,
        owned_partitions=owned[0],
        owned_replication=owned[1],
        owned_config=owned_config,
        owned_config_error=owned_error,
        owned_user_named=owned_user_named,
    )


def _describe(
    admin: AdminClient, topics: Sequence[str | None], timeout_s: float
) -> dict[str | None, tuple[int | None, int | None, str]]:
    """Each topic's (partition count, replicas of its least replicated partition, why
    not), asked in one request; (None, None, Kafka's error) for a topic Kafka answers
    about with an error (it does not exist, not authorized). Raises KafkaException when
    Kafka does not answer (a local error: unreachable, timed out)."""
    unique = list(dict.fromkeys(t for t in topics if t is not None))
    futures = admin.describe_topics(TopicCollection(unique), request_timeout=timeout_s)
    described: dict[str | None, tuple[int | None, int | None, str]] = {}
    for topic in unique:
        try:
            found = futures[topic].result(timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() < 0:
                raise
            described[topic] = (None, None, str(error))
            continue
        if not found.partitions:
            described[topic] = (None, None, "")
            continue
        replication = min(len(p.replicas) for p in found.partitions)
        described[topic] = (len(found.partitions), replication, "")
    return described


def _configs(
    admin: AdminClient, wanted: Mapping[str, Sequence[str]], timeout_s: float
) -> dict[str, tuple[dict[str, str], str | None]]:
    """Each topic's configs named in `wanted`, asked in one request: (the values, None),
    or ({}, why not) for a topic Kafka did not describe (authorization, a timeout: said
    in the condition)."""
    if not wanted:
        return {}
    resources = {topic: ConfigResource(ResourceType.TOPIC, topic) for topic in wanted}
    try:
        futures = admin.describe_configs(list(resources.values()))
    except Exception as exc:
        return {topic: ({}, str(exc) or type(exc).__name__) for topic in wanted}
    read: dict[str, tuple[dict[str, str], str | None]] = {}
    for topic, resource in resources.items():
        try:
            entries = futures[resource].result(timeout=timeout_s)
        except Exception as exc:
            read[topic] = ({}, str(exc) or type(exc).__name__)
            continue
        read[topic] = ({k: str(entries[k].value) for k in wanted[topic] if k in entries}, None)
    return read


def create_topic(
    bootstrap: str, settings: Mapping[str, str], topic: OwnedTopicSettings, timeout_s: float = 15.0
) -> str | None:
    """Create the internal topic; None when done (or it exists), else Kafka's error."""
    admin = _admin(bootstrap, settings)
    new = NewTopic(
        topic.name,
        num_partitions=topic.partitions,
        replication_factor=topic.replication,
        config=dict(topic.config),
    )
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic.name].result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return None
        return str(error or exc)
    except Exception as exc:  # a timeout
        return str(exc) or type(exc).__name__
    return None


def delete_topic(
    bootstrap: str, settings: Mapping[str, str], topic: str, timeout_s: float = 15.0
) -> str | None:
    """Delete a topic the operator created; None when done (or it is gone), else why not."""
    admin = _admin(bootstrap, settings)
    try:
        admin.delete_topics([topic], request_timeout=timeout_s)[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        return str(error or exc)
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None
