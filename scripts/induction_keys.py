"""Research note, reproducible: on smollm2's repeated random sequence (core.analysis's seeded
repeat), the top induction head's pattern attribution, and where its key side comes from.

    python scripts/induction_keys.py [--top 8]

Prints the top induction heads, the key-side marginals of the top one's pattern attribution
(sum over query components of sum_ij a_ij term_ij(a, b)), the largest head terms on the key side,
and each of those heads' previous-token score (on the same repeated sequence and on the default
sentence) with its rank among all heads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import re

    import core
    import core.analysis as ca
    from bench.common import trace_from_ids

    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    model = core.load_model("smollm2", device="cpu")
    scores = ca.head_scores(model)
    ids, start = ca.repeated_sequence(model)["decoder"]
    r = ca.REPEAT_LENGTH
    tr = trace_from_ids(model, ids, [model.tokenizer.token_str(i) for i in ids])
    # previous-token score on the repeated sequence itself, for every head
    prev_rep = {}
    for layer in range(tr.layers("decoder")):
        s = ca.map_scores(tr[f"decoder.{layer}.self_attn.weights"])
        for h, v in enumerate(s["previous_token"]):
            prev_rep[(layer, h)] = float(v)
    scores["previous_token_repeat"] = [prev_rep[(l, h)] for l, h in zip(scores["layer"], scores["head"])]
    scores["prev_rank_sentence"] = scores["previous_token"].rank(ascending=False).astype(int)
    scores["prev_rank_repeat"] = scores["previous_token_repeat"].rank(ascending=False).astype(int)
    print(f"{len(ids)} tokens, repeat of r={r} from position {start}; {len(scores)} heads")
    print("top induction heads:")
    print(scores.nlargest(5, "induction")[["layer", "head", "induction", "previous_token", "previous_token_repeat"]]
          .to_string(index=False))
    top = scores.nlargest(1, "induction").iloc[0]
    L, H = int(top["layer"]), int(top["head"])
    pa = ca.pattern_attribution(tr, "decoder", L, H)
    print(f"\nL{L}H{H}: pattern attribution sum {pa.attrs['sum']:.4f}, model's sum_ij a_ij s_ij "
          f"{pa.attrs['score']:.4f}")
    key = pa.groupby("key_component")["term"].sum()
    query = pa.groupby("query_component")["term"].sum()
    heads = key[[bool(re.match(r"^L\d+H\d+$", k)) for k in key.index]]
    print("key-side marginals, largest in size:")
    print(key.reindex(key.abs().sort_values(ascending=False).index).head(args.top).to_string())
    print("query-side marginals, largest in size:")
    print(query.reindex(query.abs().sort_values(ascending=False).index).head(5).to_string())
    print("key-side head terms, largest first (with their previous-token scores and ranks of "
          f"{len(scores)}):")
    for name, v in heads.sort_values(ascending=False).head(args.top).items():
        l, h = map(int, re.match(r"L(\d+)H(\d+)", name).groups())
        row = scores[(scores["layer"] == l) & (scores["head"] == h)].iloc[0]
        print(f"  {name}: {v:+.3f}   previous-token {row['previous_token']:.3f} (rank {row['prev_rank_sentence']}) "
              f"on the sentence, {row['previous_token_repeat']:.3f} (rank {row['prev_rank_repeat']}) on the repeat")
    # the second copy alone: the induction rows
    print("\ntop previous-token heads (repeat):")
    print(scores.nlargest(5, "previous_token_repeat")[["layer", "head", "previous_token_repeat", "previous_token"]]
          .to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
