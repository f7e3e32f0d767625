"""Regenerate the example golden set in examples/golden/ (deterministic, seed 7).

A support knowledge base of 400 chunks; 150 golden questions, 10 of which the
corpus cannot answer (negative cases). Two runs: ``hybrid-v7`` finds most relevant
chunks but often ranks them a few places down; ``dense-v8`` (a candidate) misses
more of them. Files are written in the JSONL forms and in TREC form.

    python examples/make_golden.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).parent / "golden"
TOPICS = [
    "password reset",
    "SSO login",
    "invoice download",
    "API rate limits",
    "data export",
    "webhook retries",
    "billing plans",
    "two-factor auth",
    "user roles",
    "audit logs",
]
ASKS = [
    "How do I configure {}?",
    "Why does {} fail?",
    "Where is {} documented?",
    "What are the limits of {}?",
    "Can I automate {}?",
]


def main() -> None:
    rng = random.Random(7)
    chunks = [f"kb-{doc:03d}#{part}" for doc in range(100) for part in range(4)]
    golden, run_a, run_b = [], [], []
    for i in range(150):
        query_id = f"q{i:03d}"
        text = rng.choice(ASKS).format(rng.choice(TOPICS))
        relevant = [] if i % 15 == 14 else rng.sample(chunks, rng.choice([1, 1, 2, 2, 3, 4]))
        golden.append({"query_id": query_id, "query": text, "relevant_chunk_ids": relevant})
        for run, find_p, shift in ((run_a, 0.9, 3), (run_b, 0.7, 2)):
            others = [c for c in rng.sample(chunks, 30) if c not in relevant]
            results = others[:20]
            if not relevant and rng.random() < 0.4:
                results = []  # declined: the retriever returned nothing
            for chunk in relevant:
                if rng.random() < find_p:
                    results.insert(min(len(results), int(rng.expovariate(1 / shift))), chunk)
            run.append({"query_id": query_id, "results": results[:20], "context_k": 5})
    OUT.mkdir(exist_ok=True)
    write_jsonl(OUT / "qrels.jsonl", golden)
    write_jsonl(OUT / "run_hybrid_v7.jsonl", run_a)
    write_jsonl(OUT / "run_dense_v8.jsonl", run_b)
    with open(OUT / "qrels.txt", "w") as f:
        for row in golden:
            for chunk in row["relevant_chunk_ids"]:
                f.write(f"{row['query_id']} 0 {chunk} 1\n")
    with open(OUT / "run_hybrid_v7.txt", "w") as f:
        for row in run_a:
            for rank, chunk in enumerate(row["results"], start=1):
                f.write(f"{row['query_id']} Q0 {chunk} {rank} {-rank} hybrid-v7\n")


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
