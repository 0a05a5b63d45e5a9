"""
The placebo, the optimiser's check: GRPO as train_lang.py runs it, but each group's rewards
permuted among its G samples before the advantages, so every step has RLVR's kind of prompts,
samples, kept groups (a permutation keeps a group's spread) and reward statistics, and no
information about which sample was right. A gain over the start that the placebo shows too is not
the reward's doing.

    python research/placebo.py --out_dir=out/textgame_placebo
    python research/placebo.py --task=webpage --out_dir=out/webpage_placebo

Writes eval.json / eval_val.json as train_lang.py does; "rlvr" is the placebo run.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from research import common  # noqa: E402
from tasks import TASKS, reward_fn  # noqa: E402


def permuted(score, group_size, generator):
    """`score` (grpo_step's reward_fn) with each group's G rewards permuted by `generator`: the
    rows of one group are consecutive, G per prompt (grpo.rollout)."""
    def placebo(items, completions):
        r = torch.tensor(score(items, completions), dtype=torch.float32).view(-1, group_size)
        return torch.stack([row[torch.randperm(group_size, generator=generator)]
                            for row in r]).flatten().tolist()
    return placebo


def main():
    args = common.parser(__doc__).parse_args()
    run, (train, val, test), init, model, tok = common.setup(args)
    kind = args.reward or TASKS[args.task].rewards[0]
    # the permutations draw from a stream of their own, not the sampling stream
    score = permuted(reward_fn(args.task, tok, kind), args.group_size,
                     torch.Generator().manual_seed(args.seed + 7919))
    rl = common.rlvr(run, model, tok, args, train, score)
    common.compare(run, tok, args, init, rl, train, val, test)


if __name__ == "__main__":
    main()
