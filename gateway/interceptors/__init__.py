"""The gateway's server interceptors, one concern each, stacked in one place (`build_interceptors`).

Order, outermost first: metrics (so every outcome, rejections included, is counted), auth (no
work for callers without a key), admission (draining, in-flight limit), rank metadata (the last
check before the servicer may contact an engine). Health checks skip auth, admission and metadata:
load balancers must be able to read NOT_SERVING while the gateway drains.
"""

from __future__ import annotations

from grpc import aio

from gateway.interceptors.admission import Admission, AdmissionInterceptor
from gateway.interceptors.auth import AuthInterceptor
from gateway.interceptors.metrics import MetricsInterceptor
from gateway.interceptors.rank_metadata import RankMetadataInterceptor
from gateway.metrics import GatewayMetrics

__all__ = ["Admission", "build_interceptors"]


def build_interceptors(
    api_keys: tuple[str, ...], admission: Admission, metrics: GatewayMetrics
) -> list[aio.ServerInterceptor]:
    interceptors: list[aio.ServerInterceptor] = [MetricsInterceptor(metrics)]
    if api_keys:
        interceptors.append(AuthInterceptor(api_keys))
    interceptors.append(AdmissionInterceptor(admission))
    interceptors.append(RankMetadataInterceptor(metrics))
    return interceptors
