"""The fake kubelet's own exceptions.

gRPC failures are not wrapped: they propagate as grpc.aio.AioRpcError so tests can assert the
status code and message a plugin chose. These classes cover what is the kubelet's own decision.
"""

from __future__ import annotations


class FakeKubeletError(Exception):
    """Base of every error the fake kubelet raises on its own account."""


class ProtocolViolation(AssertionError, FakeKubeletError):
    """The plugin broke a rule of the device plugin API.

    An AssertionError, so pytest reports it as a failed check of the plugin under test rather than
    as a crash of the test harness.
    """


class RegistrationRejected(FakeKubeletError):
    """The kubelet refused a Register call; the message is what the plugin receives."""


class AdmissionRejected(FakeKubeletError):
    """The kubelet could not admit a pod's device request (the pod would fail admission)."""


class EndpointStopped(FakeKubeletError):
    """The plugin's session has ended; the kubelet no longer calls it.

    Mirrors endpoint.go's errEndpointStopped: after ListAndWatch ends, the kubelet keeps the
    resource (all devices unhealthy) but refuses to call the plugin until it registers again.
    """
