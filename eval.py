"""
Evaluate world-model checkpoints on a held-out split: one entry point for every task.

    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors
    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors \
        --compare=out/textgame/mle.safetensors
    python eval.py --task=webpage --ckpt=out/webpage/rlvr.safetensors --json=result.json
    python eval.py --task=textgame --ckpt=/path/to/hf_dir --data=my_test.jsonl --device=cuda
    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors \
        --data=data/textgame/compose.jsonl
    python eval.py --task=video --ckpt=out/video/video_rlvr.safetensors --official=1 \
        --grid=g.gif  (--task=video -h)

Every language task writes "what changes" as text and is scored by its reward in rewards.py
(tasks.py):
- textgame: the state difference is merged into the current state and compared with the true next
  state; `accuracy` = exact state (binary reward), `task_specific` = the graded reward.
- webpage: the three sections of changed page items; `precision`, `recall`, `f1` (per record, then
  averaged).
Each metric is reported overall and on the transitions that change something (`_changed`) or nothing
(`_unchanged`), greedy (T=0) at the top level of the JSON, sampled (T=1) under "sampled", best-of-k
under "pass@k", per record under "per_record" (one value per record, in file order, and "changed"),
plus the baseline that exposes fake gains: always answering "nothing changes", scored by the same
reward. With --compare the paired differences (bootstrap 95% intervals over the same records) are
printed too.
`n_cropped` counts prompts too long for the model's block_size, which keep only their last tokens
(tasks.crop).
data/textgame/compose.jsonl, the text game's composition split (records whose game, room objects and
action never occur together in train; data/textgame/prepare.py), is made when it is missing.

Video (evaluate_video.py): rollouts on the split's windows, decoded with the true last context
frame, against copy-last-frame and the tokenizer's ceiling; --official=1 adds the paper's protocol
(T=1, top-k 100) under "sampled".
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from checkpoint import read_meta, write_json
from data.robot.prepare import DATA_DIR, ensure_splits
from data.robot.task import clips, load_split
from data.textgame.prepare import COMPOSE_PATH, ensure_compose
from evaluate_lang import evaluate, pct, print_paired, print_table
from evaluate_video import (OFFICIAL, EvalSpec, eval_video, load_video_model, paired_video,
                            print_video_paired, print_video_table)
from rewards_video import load_lpips
from runtime import check_device, check_ranges
from tasks import TASKS, load_lang_model

ROOT = Path(__file__).resolve().parent


def main():
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task", default="textgame")
    if pre.parse_known_args()[0].task == "video":  # decoded frames, not text: flags of its own
        return video_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--task", default="textgame", choices=sorted(TASKS) + ["video"],
                   help="video: see python eval.py --task=video --help")
    p.add_argument("--ckpt", required=True,
                   help="our .safetensors checkpoint or an HF model directory")
    p.add_argument("--compare", default=None, help="a second checkpoint, printed side by side")
    p.add_argument("--data", default=None,
                   help="JSONL records (default: the embedded split --split)")
    p.add_argument("--split", default="test", choices=["val", "test"],
                   help="the embedded split when --data is not given")
    p.add_argument("--json", default=None, help="write the result here")
    p.add_argument("--limit", type=int, default=0,
                   help="evaluate the first N records only (0 = all)")
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--pass_k", type=int, default=4, help="samples per record for pass@k (0 = skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest for tiny models)")
    args = p.parse_args()
    check_ranges(p, args, at_least_1=("max_new_tokens", "batch_size", "threads"),
                 at_least_0=("limit", "pass_k"))
    torch.set_num_threads(args.threads)
    T = TASKS[args.task]
    data = Path(args.data) if args.data else ROOT / "data" / args.task / f"{args.split}.jsonl"
    # the composition split: made from train when missing
    if data.resolve() == COMPOSE_PATH.resolve():
        ensure_compose()
    if not data.is_file():
        hint = "" if args.data else f" (run python data/{args.task}/prepare.py)"
        sys.exit(f"error: --data {data}: file not found{hint}")
    ckpts = [args.ckpt] + ([args.compare] if args.compare else [])
    try:
        check_device(args.device)
        for ck in ckpts:   # a file of ours must be a language model (an HF directory always is)
            if Path(ck).is_file() and "vq" in read_meta(ck)["args"]:
                raise ValueError(f"{ck}: a video world model of train_video.py; evaluate it with "
                                 f"python eval.py --task=video --ckpt={ck}")
        records = T.data.load_records(data)[:args.limit or None]
        rows = {}
        for ck in ckpts:
            model, tok, _ = load_lang_model(ck, args.device)
            rows[ck] = evaluate(args.task, model, tok, records, args.max_new_tokens,
                                args.batch_size, True, args.pass_k, args.seed,
                                desc=Path(ck).name)
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


def video_main(argv):
    """--task=video: decoded frames, not text, so flags of their own
    (`python eval.py --task=video -h`)."""
    p = argparse.ArgumentParser(description="evaluate a video world model on held-out episodes",
                                prog="eval.py --task=video", allow_abbrev=False)
    p.add_argument("--task", default="video", choices=["video"])
    p.add_argument("--ckpt", default=None, help="a world-model checkpoint of train_video.py")
    p.add_argument("--compare", default=None,
                   help="a second world model on the same windows; paired differences "
                        "--ckpt minus --compare are printed")
    p.add_argument("--data", default=str(DATA_DIR),
                   help="episode directory (default: the embedded robot data)")
    p.add_argument("--split", default="test")
    p.add_argument("--mode", default=None, choices=["single", "multi"],
                   help="default: the checkpoint's")
    p.add_argument("--limit", type=int, default=0, help="first N episodes only (0 = all)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top_k", type=int, default=0,
                   help="sample among the k likeliest codes only (0: all)")
    p.add_argument("--copy_gate", type=int, default=-1, choices=[-1, 0, 1],
                   help="1 / 0: decode every model with / without the per-frame tokenizer's "
                        "copy gate (train_video.py's RLVR and control stages decode with it); "
                        "-1: as each was trained")
    p.add_argument("--official", type=int, default=0,
                   help="1: also the paper's protocol, sampled at T=1 with top-k 100 "
                        "(seed --seed), next to the --temperature row")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled rollouts")
    p.add_argument("--lpips", default=None,
                   help="LPIPS-VGG safetensors (tools/convert_lpips.py); else lpips is null")
    p.add_argument("--json", default=None)
    p.add_argument("--grid", default=None, help="write a .gif or .png grid here")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    check_ranges(p, args, at_least_1=("threads",), at_least_0=("limit",))
    torch.set_num_threads(args.threads)
    if args.ckpt is None:
        p.error("give --ckpt (a world model)")
    if args.temperature < 0 or args.top_k < 0:
        p.error(f"--temperature and --top_k must be >= 0, got {args.temperature} and {args.top_k}")
    rows = {}                    # row name -> eval_video result; the JSON keeps the --ckpt greedy
                                 # one at the top
    try:
        check_device(args.device)
        # every model and the LPIPS weights first: a bad file stops before any data is generated
        models = {ck: load_video_model(ck, args.device, args.copy_gate)
                  for ck in [args.ckpt] + ([args.compare] if args.compare else [])}
        lpips_net = load_lpips(args.lpips, args.device)
        ensure_data(args.data)
        for ck, loaded in models.items():
            res = eval_one(args, ck, loaded, lpips_net,
                           dict(temperature=args.temperature, top_k=args.top_k or None))
            if args.official:    # the same windows sampled with the paper's protocol
                res["sampled"] = eval_one(args, ck, loaded, lpips_net, OFFICIAL, grid=False)
            rows[ck] = res
    except ValueError as e:
        sys.exit(f"error: {e}")
    names = {k: f"{i}:{Path(k).name}" if args.compare else Path(k).name for i, k in enumerate(rows)}
    table = {}
    for k, r in rows.items():    # the --temperature row, then the official row of each model
        table[names[k]] = r
        if args.official:
            table[f"{names[k]} T=1 top-k 100"] = r["sampled"]
    print_video_table(table)
    if args.compare:             # --ckpt minus --compare over the same windows (and the official
                                 # samples)
        a, b = names[args.ckpt], names[args.compare]
        for key in (None, "sampled") if args.official else (None,):
            try:
                # copying does not sample
                pairs = [(a, b)] + ([(a, "copy"), (b, "copy")] if key is None else [])
                print_video_paired(paired_video({names[k]: r[key] if key else r
                                                 for k, r in rows.items()}, pairs))
            except ValueError as e:   # another clip length or mode: not the same windows
                sys.exit(f"error: --compare: {e}")
    if args.lpips is None:
        print("lpips: null (no --lpips weights given; see tools/convert_lpips.py)")
    if args.json:
        write_json(args.json, rows[args.ckpt] if not args.compare else rows)


def ensure_data(data):
    """The embedded robot data is generated when its folder holds no split (a ValueError when it
    holds some); any other --data is read as it is."""
    if Path(data).resolve() == DATA_DIR.resolve():
        ensure_splits(DATA_DIR)


def eval_one(args, ckpt, loaded, lpips_net, sampling, grid=True):
    """One world model (`loaded`: load_video_model's (model, tokenizer, meta) of the file `ckpt`) on
    the --split windows of its own mode, clip length and action bins -> eval_video's dict."""
    model, vq, meta = loaded
    a = meta["args"]
    episodes = clips(load_split(args.data, args.split, vq.config.size, args.limit),
                     a.get("clip_len", 16))
    if not episodes:
        raise ValueError(f"no {args.split} episode has {a.get('clip_len', 16)} frames")
    horizon = a["horizon"] if (args.mode or a["mode"]) == "multi" else 1
    spec = EvalSpec(np.array(a["action_lo"], np.float32), np.array(a["action_hi"], np.float32),
                    a.get("context", 1), horizon, seed=args.seed, **sampling)
    return eval_video(model, vq, episodes, None, spec, lpips_net,
                      grid_path=args.grid if grid and ckpt == args.ckpt else None)


if __name__ == "__main__":
    main()
