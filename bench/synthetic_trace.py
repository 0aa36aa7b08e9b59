"""Write a seeded synthetic trace in the Mooncake JSONL format, for `-w trace` when no real trace
is at hand: `timestamp` (ms, Poisson), `input_length`, `output_length`, `hash_ids` (512-token blocks).

Shape: a few Zipf-popular applications, each with its own system prefix of 2–6 blocks; half of the
requests continue an earlier request of the same application (its blocks plus 1–2 new ones, as a
conversation's next turn), the rest start fresh after the application prefix.

    .venv/bin/python bench/synthetic_trace.py --requests 2000 --rate 1 --out trace.jsonl
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import orjson

BLOCK = 512
MAX_BLOCKS = 12  # + output stays inside the stub's 8192-token context


def generate(requests: int, rate: float, apps: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    prefixes = [fresh(rng.randint(2, 6)) for _ in range(apps)]
    weights = [1 / (i + 1) ** 1.1 for i in range(apps)]
    recent: list[list[list[int]]] = [[] for _ in range(apps)]
    rows, now = [], 0.0
    for _ in range(requests):
        app = rng.choices(range(apps), weights)[0]
        if recent[app] and rng.random() < 0.5:
            parent = recent[app].pop(rng.randrange(len(recent[app])))
            hash_ids = parent + fresh(rng.randint(1, 2))
        else:
            hash_ids = prefixes[app] + fresh(rng.randint(1, 3))
        if len(hash_ids) <= MAX_BLOCKS:
            recent[app] = (recent[app] + [hash_ids])[-32:]
        hash_ids = hash_ids[:MAX_BLOCKS]
        rows.append(
            {
                "timestamp": round(now * 1000),
                "input_length": len(hash_ids) * BLOCK - rng.randrange(BLOCK),
                "output_length": rng.randint(20, 300),
                "hash_ids": hash_ids,
            }
        )
        now += rng.expovariate(rate)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second")
    parser.add_argument("--apps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("trace.jsonl"))
    args = parser.parse_args()
    rows = generate(args.requests, args.rate, args.apps, args.seed)
    args.out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    print(f"wrote {len(rows)} requests to {args.out}")


if __name__ == "__main__":
    main()
