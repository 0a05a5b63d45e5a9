"""
Evaluate world-model checkpoints on a held-out split: one entry point for every task.

    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors
    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors --compare=out/textgame/mle.safetensors
    python eval.py --task=webpage --ckpt=out/webpage/rlvr.safetensors --json=result.json
    python eval.py --task=textgame --ckpt=/path/to/hf_dir --data=my_test.jsonl --device=cuda
    python eval.py --task=video --ckpt=out/video/rlvr.safetensors --grid=grid.gif   (python eval.py --task=video -h)

Every language task writes "what changes" as text and is scored by its reward in rewards.py (data/tasks.py):
- textgame: the state difference is merged into the current state and compared with the true next state;
  `accuracy` = exact state (binary reward), `task_specific` = the graded reward.
- webpage: the three sections of changed page items; `precision`, `recall`, `f1` (per record, then averaged).
Each metric is reported overall and on the transitions that change something (`_changed`) or nothing
(`_unchanged`), greedy (T=0) at the top level of the JSON, sampled (T=1) under "sampled", best-of-k under
"pass@k", per record under "per_record" (one value per record, in file order, and "changed"), plus the baseline that
exposes fake gains: always answering "nothing changes", scored by the same reward. With --compare the paired
differences (bootstrap 95% intervals over the same records) are printed too.
`n_cropped` counts prompts too long for the model's block_size, which keep only their last tokens (data/tasks.crop).
"""
import argparse
import sys
from pathlib import Path

import torch

from checkpoint import write_json
from data.tasks import TASKS, evaluate, load_lang_model, pct, print_paired, print_table

ROOT = Path(__file__).resolve().parent


def main():
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="textgame")
    if pre.parse_known_args()[0].task == "video":  # decoded frames, not text: flags of its own (video_eval.py)
        from video_eval import main as video_main
        return video_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="textgame", choices=sorted(TASKS) + ["video"],
                   help="video: see python eval.py --task=video --help")
    p.add_argument("--ckpt", required=True, help="our .safetensors checkpoint or an HF model directory")
    p.add_argument("--compare", default=None, help="a second checkpoint, printed side by side")
    p.add_argument("--data", default=None, help="JSONL records (default: the embedded split --split)")
    p.add_argument("--split", default="test", choices=["val", "test"],
                   help="the embedded split when --data is not given")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--limit", type=int, default=0, help="evaluate the first N records only (0 = all)")
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--pass_k", type=int, default=4, help="samples per record for pass@k (0 = skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for tiny models)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    T = TASKS[args.task]
    data = Path(args.data) if args.data else ROOT / "data" / args.task / f"{args.split}.jsonl"
    if not data.is_file():
        hint = "" if args.data else f" (run python data/{args.task}/prepare.py)"
        sys.exit(f"error: --data {data}: file not found{hint}")
    try:
        records = T.data.load_records(data)[:args.limit or None]
        rows = {}
        for ck in [args.ckpt] + ([args.compare] if args.compare else []):
            model, tok, _ = load_lang_model(ck, args.device)
            rows[ck] = evaluate(args.task, model, tok, records, args.max_new_tokens, args.batch_size, True,
                                args.pass_k, args.seed, desc=Path(ck).name)
    except ValueError as e:
        sys.exit(f"error: {e}")
    names = {k: f"{i}:{Path(k).name}" for i, k in enumerate(rows)}   # two files may share a name
    print_table(args.task, {names[k]: v for k, v in rows.items()})
    if args.compare:
        print_paired(args.task, {names[k]: v for k, v in rows.items()}, names[args.compare])
    if args.pass_k:
        for k, v in rows.items():
            print(f"{names[k]}: pass@{args.pass_k} = {pct(v[f'pass@{args.pass_k}'][T.headline])}")
    if args.json:
        result = rows[args.ckpt] if not args.compare else rows
        write_json(args.json, result)


if __name__ == "__main__":
    main()
