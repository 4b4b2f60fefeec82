"""EmbedderService: texts in, the encoder's vectors out (packed little-endian float32)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np

from engram.embedder.v1 import embedder_service_pb2 as pb
from engram.embedder.v1 import embedder_service_pb2_grpc as pb_grpc
from services.common.admission import READ, MethodKinds
from services.common.auth import SHARD_SERVICE, MethodPolicy
from services.common.errors import InvalidArgument
from services.common.limits import check_limit
from services.common.settings import LimitsSettings
from services.shard.retrieval.embedding import EmbeddingProvider

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EmbedderService"].full_name
_CALLERS = frozenset({SHARD_SERVICE})  # the shards' service principal, nobody else


def _m(name: str) -> str:
    return f"/{SERVICE_NAME}/{name}"


POLICY: MethodPolicy = {_m("Embed"): _CALLERS, _m("Describe"): _CALLERS}
assert set(POLICY) == {
    _m(m.name) for m in pb.DESCRIPTOR.services_by_name["EmbedderService"].methods
}
KINDS: MethodKinds = {_m("Embed"): READ, _m("Describe"): READ}  # pure: nothing is stored
assert set(KINDS) == set(POLICY)


def check_texts(texts: Sequence[str], limits: LimitsSettings) -> None:
    """At least one text, at most ENGRAM_LIMITS_BATCH_ITEMS, each within the record-content
    byte limit: INVALID_ARGUMENT (NO_TEXTS, LIMIT_EXCEEDED naming the setting) otherwise."""
    if not texts:
        raise InvalidArgument("texts is empty: send at least one text to embed",
                              reason="NO_TEXTS")
    check_limit("the number of texts", len(texts), limits.batch_items,
                "ENGRAM_LIMITS_BATCH_ITEMS")
    for position, text in enumerate(texts):
        check_limit(f"texts[{position}]", len(text.encode("utf-8")), limits.content_bytes,
                    "ENGRAM_LIMITS_CONTENT_BYTES", "bytes")


class EmbedderServicer(pb_grpc.EmbedderServiceServicer):
    def __init__(self, encoder: EmbeddingProvider, limits: LimitsSettings) -> None:
        self._encoder = encoder
        self._limits = limits

    def Embed(self, request: pb.EmbedRequest,
              context: grpc.ServicerContext) -> pb.EmbedResponse:
        texts = list(request.texts)
        check_texts(texts, self._limits)
        run = self._encoder.embed_background if request.background else self._encoder.embed
        vectors = np.ascontiguousarray(run(texts), dtype="<f4")
        return pb.EmbedResponse(model=self._encoder.name, dimension=self._encoder.dimension,
                                vectors=vectors.tobytes())

    def Describe(self, request: pb.DescribeRequest,
                 context: grpc.ServicerContext) -> pb.DescribeResponse:
        return pb.DescribeResponse(model=self._encoder.name, dimension=self._encoder.dimension)


def add_to_server(servicer: EmbedderServicer, server: grpc.Server) -> None:
    pb_grpc.add_EmbedderServiceServicer_to_server(servicer, server)
