"""
How much can RLVR gain from a language checkpoint? Its greedy answer against the best of G samples, on a split.

GRPO reinforces the model's own samples. A record whose greedy answer is wrong while one of G samples at the RL
temperature is right is one that sharpening can fix; where no sample is right, the model would have to discover a
new answer. A group whose G rewards are all equal gives no GRPO gradient. For one checkpoint this prints, overall and
on changed / unchanged records: the greedy score, the mean sample score, the best-of-G score (pass@G for the text
game), the share of records whose best sample beats greedy ("headroom"), and the share of zero-spread groups; for the
text game also what the greedy answer gets wrong on changed transitions. With --horizon=K > 1 the same numbers for
K-step imagination (research/chains.py): one "record" is a chain of K recorded steps of an episode
(research/chains.py's episode_chains), each step after the first prompted with the state the chain's previous answer leads to, every
step greedy or every step sampled, and the reward is the chain's (chains.chain_reward: text game, the imagined final
state is exact; web page, the F1 of the K-th predicted changes); --limit counts chains.

    python research/rl_headroom.py --ckpt=checkpoints/textgame/mle.safetensors --data=data/textgame/val.jsonl   # 2 min
    python research/rl_headroom.py --task=webpage --ckpt=checkpoints/webpage/mle.safetensors \
        --data=data/webpage/val.jsonl
    python research/rl_headroom.py --ckpt=checkpoints/textgame/mle.safetensors --data=data/textgame/test.jsonl \
        --horizon=3 --limit=150      # 150 chains of 3 steps
    python research/rl_headroom.py --tiny      # a random tiny model on 8 generated records: the smoke test
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from eval import summarize  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from rewards import parse_diff  # noqa: E402
from research.chains import (CHAINING, chain_reward, episode_chains, imagine_chains,  # noqa: E402
                             text_predictor)
from tasks import TASKS, generate_texts, load_lang_model  # noqa: E402
from tokenizer_text import Tokenizer  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip(), allow_abbrev=False)
p.add_argument("--task", default="textgame", choices=sorted(TASKS))
p.add_argument("--ckpt", default=None, help="our .safetensors checkpoint or an HF model directory")
p.add_argument("--data", default=None, help="JSONL records (default: the embedded validation split)")
p.add_argument("--G", type=int, default=8, help="samples per record, as GRPO's group size")
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--max_new_tokens", type=int, default=200)
p.add_argument("--limit", type=int, default=0, help="first N records (chains) only (0 = all)")
p.add_argument("--horizon", type=int, default=1, help="K > 1: chains of K imagined steps (research/chains.py)")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--json", default=None, help="write the numbers here")
p.add_argument("--tiny", action="store_true", help="random tiny model on 8 generated records (smoke test)")
args = p.parse_args()
torch.set_num_threads(args.threads)
T = TASKS[args.task]
if args.horizon < 1 or (args.horizon > 1 and args.task not in CHAINING):
    sys.exit(f"error: --horizon {args.horizon}: must be 1, or > 1 for a task with chains (textgame, webpage)")

# -----------------------------------------------------------------------------
# model and records
if args.tiny:
    tmp = Path(tempfile.mkdtemp())
    T.prepare.ensure_splits(tmp, n_train=8, n_val=8, n_test=8, verbose=False)
    records = T.data.load_records(tmp / "val.jsonl")
    tok = Tokenizer.train([T.data.prompt_text(r) + T.data.target_text(r) for r in records], 300)
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=1024, n_layer=1, n_head=2, n_embd=32))
    args.max_new_tokens = 16
else:
    if args.ckpt is None:
        sys.exit("error: --ckpt is required (or --tiny)")
    data = Path(args.data) if args.data else Path(__file__).resolve().parents[1] / "data" / args.task / "val.jsonl"
    if not data.is_file():
        sys.exit(f"error: --data {data}: file not found")
    try:
        records = T.data.load_records(data)
        model, tok, _ = load_lang_model(args.ckpt)
    except ValueError as e:
        sys.exit(f"error: {e}")
headline_reward = T.rewards[0]
g = torch.Generator().manual_seed(args.seed)
if args.horizon == 1:
    records = records[:args.limit or None]
    prompts = [tok.encode(T.data.prompt_text(r)) for r in records]
    changed = [T.data.is_changed(r) for r in records]

    # -------------------------------------------------------------------------
    # greedy, then G samples per record at the RL temperature
    def score(texts):
        return [T.reward(t, r, headline_reward) for t, r in zip(texts, records)]

    greedy_texts = generate_texts(model, tok, prompts, args.max_new_tokens, 0.0, desc="greedy")
    greedy = score(greedy_texts)
    samples = [score(generate_texts(model, tok, prompts, args.max_new_tokens, args.temperature, 64, g,
                                    f"sample {i + 1}"))
               for i in range(args.G)]
else:
    # -------------------------------------------------------------------------
    # chains: every step greedy, then G chains per start with every step sampled
    records = episode_chains(args.task, records, args.horizon)[:args.limit or None]
    changed = [any(map(T.data.is_changed, c)) for c in records]

    def chain_rewards(temperature, generator=None):
        steps = imagine_chains(args.task, records, text_predictor(model, tok, args.task, args.max_new_tokens,
                                                                  temperature, generator))
        return [chain_reward(args.task, c, s, headline_reward) for c, s in zip(records, steps)]

    greedy = chain_rewards(0.0)
    samples = [chain_rewards(args.temperature, g) for _ in range(args.G)]
per_record = list(zip(*samples))      # (records, G)

# -----------------------------------------------------------------------------
# summary, overall and on changed / unchanged records (eval.summarize averages each per-record field)
METRICS = ("greedy", "sample_mean", "best_of_G", "headroom", "zero_spread_groups")
per_record_metrics = [dict(zip(METRICS, (greedy[i], sum(rs) / args.G, max(rs), float(max(rs) > greedy[i]),
                                         float(max(rs) == min(rs)))))
                      for i, rs in enumerate(per_record)]
result = dict(summarize(per_record_metrics, changed), n=len(records), n_changed=sum(changed), G=args.G,
              temperature=args.temperature, horizon=args.horizon)
if args.task == "textgame" and args.horizon == 1:      # what a wrong greedy answer gets wrong, on changed ones
    errors = {}
    for i, r in enumerate(records):
        if not changed[i] or greedy[i] == 1.0:
            continue
        pred, true = parse_diff(greedy_texts[i]), T.data.make_diff(r["state"], r["next_state"])
        if pred is None:
            kind = "unparseable"
        elif (sorted(str(o["uuid"]) for o in pred["modified"]) != sorted(str(o["uuid"]) for o in true["modified"])
              or sorted(map(str, pred["removed"])) != sorted(map(str, true["removed"]))):
            kind = "wrong objects changed or removed"
        elif pred["score"] != true["score"]:
            kind = "wrong score"
        else:
            want = {str(o["uuid"]): o for o in true["modified"]}
            wrong_props = any(o["properties"] != want[str(o["uuid"])]["properties"] for o in pred["modified"])
            kind = "wrong property value" if wrong_props else "wrong contents"
        errors[kind] = errors.get(kind, 0) + 1
    result["greedy_errors_changed"] = errors

what = "records" if args.horizon == 1 else f"chains of {args.horizon} steps"
print(f"{args.task}, {len(records)} {what}, {args.G} samples each at T={args.temperature}, reward {headline_reward}:")
print(f"{'part':<10} {'n':>5} {'greedy':>8} {'sample':>8} {'best-of-G':>10} {'headroom':>9} {'zero-spread':>12}")
for part, suffix, n in (("all", "", len(records)), ("changed", "_changed", result["n_changed"]),
                        ("unchanged", "_unchanged", len(records) - result["n_changed"])):
    if n:
        print(f"{part:<10} {n:>5}" + "".join(f" {100 * result[m + suffix]:>{w}.2f}"
                                              for m, w in zip(METRICS, (8, 8, 10, 9, 12))))
if "greedy_errors_changed" in result:
    print("greedy errors on changed records:", json.dumps(result["greedy_errors_changed"]))
if args.json:
    write_json(args.json, result)
