"""Probe: would a second embedding model lift the shard's LoCoMo recall? (docs/retrieval.md)

Two steps, because the second model runs on torch, which Engram does not install:

1. ``embed``: with any Python that has ``sentence-transformers`` (a scratch venv), write
   the normalised vectors of every turn and question of FILES to an ``.npz``::

       /tmp/st/bin/python tools/locomo_second_model.py embed MODEL_DIR out.npz FILES...

   or, with Engram's venv, the vectors of the shard's own encoder (``minilm``, ``mpnet``
   after ``make mpnet``, or a model directory; int8 unless ``--float32``)::

       .venv/bin/python tools/locomo_second_model.py embed-engram mpnet mpnet.npz FILES...

2. ``score``: with Engram's venv, run the harness of ``tools/locomo_offline.py`` with
   the concatenation of one or more such files as the dense signal::

       .venv/bin/python tools/locomo_second_model.py score minilm.npz,mpnet.npz \\
           --weights 1,0.5 --lexical-weight 0.4 [--map-queries] FILES...

``--map-queries`` keeps the second and later models off the query path: a query's
vector for them is its first-model vector through a ridge map fitted on the turns of
the *other* conversations (documents still carry every model's vector); with
``--fit self``, on the turns of the question's own conversation, as a shard would fit
one map per fleet on the fleet's own records (docs/retrieval.md, "The quality profile").
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engram.eval.locomo import Conversation, load_conversation


def _key(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _texts(convs: list[Conversation]) -> list[str]:
    texts = [t.memory_text() for c in convs for t in c.turns]
    texts += [q.text for c in convs for q in c.questions]
    return list(dict.fromkeys(texts))


def embed(model_dir: str, out: str, files: list[str]) -> None:
    from sentence_transformers import SentenceTransformer  # scratch venv only

    texts = _texts([load_conversation(f) for f in files])
    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True)
    np.savez(out, keys=np.array([_key(t) for t in texts]), vectors=vectors.astype(np.float32))
    print(f"{len(texts)} texts -> {out} {vectors.shape}")


def embed_engram(name: str, out: str, files: list[str], int8: bool) -> None:
    import tempfile

    from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder
    from services.shard.retrieval.encoder_choice import encoder_spec

    texts = _texts([load_conversation(f) for f in files])
    with tempfile.TemporaryDirectory(prefix="engram-probe-") as home:
        chosen = encoder_spec(name, Path(home), int8, "embed-engram")
        if chosen is None:
            raise SystemExit(f"{name!r} names no encoder")
        spec, as_int8 = chosen
        model = OnnxBertEmbedder(spec, int8=as_int8, threads=2, build_apart=True)
        try:
            vectors = np.concatenate([model.embed(texts[start : start + 64])
                                      for start in range(0, len(texts), 64)])
        finally:
            model.close()
    np.savez(out, keys=np.array([_key(t) for t in texts]), vectors=vectors.astype(np.float32))
    print(f"{len(texts)} texts -> {out} {vectors.shape}")


class Tables:
    """Vectors by text for each model, concatenated with per-model weights."""

    def __init__(self, paths: list[str], weights: list[float]) -> None:
        self.tables: list[dict[str, np.ndarray]] = []
        for path in paths:
            with np.load(path) as data:
                self.tables.append(dict(zip(data["keys"].tolist(), data["vectors"], strict=True)))
        self.scales = [float(np.sqrt(w)) for w in weights]
        self.widths = [next(iter(t.values())).shape[0] for t in self.tables]

    def part(self, model: int, texts: list[str]) -> np.ndarray:
        return np.stack([self.tables[model][_key(t)] for t in texts])

    @staticmethod
    def join(parts: list[np.ndarray], scales: list[float]) -> np.ndarray:
        joined = np.concatenate([p * s for p, s in zip(parts, scales, strict=True)], axis=1)
        return (joined / np.linalg.norm(joined, axis=1, keepdims=True)).astype(np.float32)


class ProbeEmbedder:
    """The harness's embedder interface over :class:`Tables` for one conversation."""

    def __init__(self, tables: Tables, maps: list[np.ndarray] | None, turns: set[str]) -> None:
        self.tables, self.maps, self.turns = tables, maps, turns
        self.dimension = sum(tables.widths)

    def embed(self, texts: list[str]) -> np.ndarray:
        first = self.tables.part(0, texts)
        parts = [first]
        for model in range(1, len(self.tables.tables)):
            if self.maps is None or all(t in self.turns for t in texts):
                parts.append(self.tables.part(model, texts))
            else:  # queries: mapped from the first model's vector
                mapped = first @ self.maps[model - 1]
                parts.append(mapped / np.linalg.norm(mapped, axis=1, keepdims=True))
        return Tables.join(parts, self.tables.scales)


def ridge_maps(tables: Tables, texts: list[str], ridge: float) -> list[np.ndarray]:
    x = tables.part(0, texts)
    gram = x.T @ x + ridge * np.eye(x.shape[1], dtype=x.dtype)
    return [
        np.linalg.solve(gram, x.T @ tables.part(m, texts)) for m in range(1, len(tables.tables))
    ]


def score(args: argparse.Namespace) -> None:
    import locomo_offline as harness

    paths = args.vectors.split(",")
    weights = [float(w) for w in args.weights.split(",")] if args.weights else [1.0] * len(paths)
    tables = Tables(paths, weights)
    convs = [load_conversation(f) for f in args.files]

    def embedder_of(conv: Conversation) -> ProbeEmbedder:
        fitted = [t.memory_text() for c in convs
                  if (c.name == conv.name) == (args.fit == "self") for t in c.turns]
        maps = ridge_maps(tables, fitted, args.ridge) if args.map_queries else None
        return ProbeEmbedder(tables, maps, {t.memory_text() for t in conv.turns})

    settings = replace(harness.BEST, lexical_weight=args.lexical_weight)
    result = harness.evaluate(convs, "hybrid", settings, embedder_of, set(args.tune.split(",")))
    print(" ".join(f"{name} {part['recall@5']:.4f}/{part['recall@10']:.4f}"
                   for name, part in result.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("embed", help="vectors of every turn and question (needs torch)")
    one.add_argument("model_dir")
    one.add_argument("out")
    one.add_argument("files", nargs="+")
    own = sub.add_parser("embed-engram", help="vectors of every turn and question from the "
                         "shard's own encoder (no torch)")
    own.add_argument("name", help="minilm, mpnet (after `make mpnet`) or a model directory")
    own.add_argument("out")
    own.add_argument("files", nargs="+")
    own.add_argument("--float32", action="store_true", help="not int8")
    two = sub.add_parser("score", help="hybrid recall@5/@10 with these vectors as the dense signal")
    two.add_argument("vectors", help="comma-separated .npz files written by 'embed'")
    two.add_argument("files", nargs="+")
    two.add_argument("--weights", default="", help="per-file weights (default 1 each)")
    two.add_argument("--lexical-weight", type=float, default=0.5)
    two.add_argument("--map-queries", action="store_true")
    two.add_argument("--ridge", type=float, default=1.0)
    two.add_argument("--fit", choices=("others", "self"), default="others",
                     help="fit the map on the other conversations' turns, or the question's own")
    two.add_argument("--tune", default="26,30")
    args = parser.parse_args()
    if args.command == "embed":
        embed(args.model_dir, args.out, args.files)
    elif args.command == "embed-engram":
        embed_engram(args.name, args.out, args.files, not args.float32)
    else:
        score(args)


if __name__ == "__main__":
    main()
