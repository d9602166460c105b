"""The Atmosphere message bus: protobuf messages on NATS subjects, JetStream, typed errors.

This package is the only code in the system that imports `nats`. Services talk to it through
the `Bus` interface; unit tests use `atmosphere.bus.testing.FakeBus`.
"""

from atmosphere.bus import run_queue, runs, sizes, subjects, text
from atmosphere.bus._api import (
    BatchHandler,
    Bus,
    Consumer,
    ConsumerState,
    Envelope,
    PublishAck,
    Subscription,
    WorkHandler,
    WorkItem,
)
from atmosphere.bus._codec import Headers
from atmosphere.bus._connect import connect, reconnect_delay, without_login
from atmosphere.bus._jetstream import (
    BucketSpec,
    ConsumerSpec,
    JetStreamLayout,
    ObjectBucketSpec,
    Replication,
    RequiredLayout,
    Retention,
    Storage,
    StreamSpec,
)
from atmosphere.bus._nats import NatsBus
from atmosphere.bus._provisioning import PROVISIONED_BY, LayoutNotProvisionedError
from atmosphere.bus._retry import request_retrying
from atmosphere.bus._router import Handler, MessageContext, Route, Router
from atmosphere.bus.errors import (
    BusError,
    ConnectError,
    ConnectionLostError,
    DecodeError,
    Nak,
    NoRespondersError,
    NoStreamError,
    PayloadTooLargeError,
    RemoteError,
    RequestTimeoutError,
    ServiceError,
    StreamUnavailableError,
    Term,
    WrongLastSequenceError,
)

__all__ = [
    "PROVISIONED_BY",
    "BatchHandler",
    "BucketSpec",
    "Bus",
    "BusError",
    "ConnectError",
    "ConnectionLostError",
    "Consumer",
    "ConsumerSpec",
    "ConsumerState",
    "DecodeError",
    "Envelope",
    "Handler",
    "Headers",
    "JetStreamLayout",
    "LayoutNotProvisionedError",
    "MessageContext",
    "Nak",
    "NatsBus",
    "NoRespondersError",
    "NoStreamError",
    "ObjectBucketSpec",
    "PayloadTooLargeError",
    "PublishAck",
    "RemoteError",
    "Replication",
    "RequestTimeoutError",
    "RequiredLayout",
    "Retention",
    "Route",
    "Router",
    "ServiceError",
    "Storage",
    "StreamSpec",
    "StreamUnavailableError",
    "Subscription",
    "Term",
    "WorkHandler",
    "WorkItem",
    "WrongLastSequenceError",
    "connect",
    "reconnect_delay",
    "request_retrying",
    "run_queue",
    "runs",
    "sizes",
    "subjects",
    "text",
    "without_login",
]
