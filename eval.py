"""
Evaluate world-model checkpoints on a held-out split: one entry point for every task.

    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors
    python eval.py --task=textgame --ckpt=out/textgame/rlvr.safetensors --compare=out/textgame/mle.safetensors
    python eval.py --task=webpage --ckpt=out/webpage/rlvr.safetensors --json=result.json
    python eval.py --task=textgame --ckpt=/path/to/hf_dir --data=my_test.jsonl --device=cuda
    python eval.py --task=video --ckpt=out/video/rlvr.safetensors --grid=grid.gif   (flags: video_eval.py)

Every language task writes "what changes" as text and is scored by its reward in rewards.py:
- textgame: the state difference is merged into the current state and compared with the true next state;
  `accuracy` = exact state (binary reward).
- webpage: the three sections of changed page items; `precision`, `recall`, `f1` (per record, then averaged).
Each metric is reported overall and on the transitions that change something (`_changed`) or nothing
(`_unchanged`), greedy (T=0) at the top level of the JSON, sampled (T=1) under "sampled", best-of-k under
"pass@k", plus the baseline that exposes fake gains: always answering "nothing changes", scored by the same reward.
`n_cropped` counts prompts too long for the model's block_size, which keep only their last tokens (see `crop`).
"""
import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

from checkpoint import atomic_write_text, load_model
from data.textgame import prepare as textgame_prepare, task as textgame_task
from data.webpage import prepare as webpage_prepare, task as webpage_task
from model import GPT
from rewards import textgame_reward, web_prf
from tokenizer_text import load_tokenizer

ROOT = Path(__file__).resolve().parent


def textgame_metrics(text, record):
    return {"accuracy": textgame_reward(text, record["state"], record["next_state"], "binary"),
            "task_specific": textgame_reward(text, record["state"], record["next_state"], "task_specific")}


def webpage_metrics(text, record):
    return dict(zip(("precision", "recall", "f1"), web_prf(text, webpage_task.target_text(record))))


# a language task: its data module (load_records, prompt_text, target_text, is_changed), split generator,
# per-record metrics, the headline metric, the rewards RLVR can use, and the "nothing changes" answer
TASKS = {
    "textgame": SimpleNamespace(data=textgame_task, prepare=textgame_prepare, metrics=textgame_metrics,
                                headline="accuracy", rewards=("binary", "task_specific"),
                                no_change='{"modified":[],"removed":[],"score":{}}',
                                reward=lambda text, r, kind: textgame_reward(text, r["state"], r["next_state"], kind)),
    "webpage": SimpleNamespace(data=webpage_task, prepare=webpage_prepare, metrics=webpage_metrics, headline="f1",
                               rewards=("f1",), no_change="New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\nNone",
                               reward=lambda text, r, kind: web_prf(text, webpage_task.target_text(r))[2]),
}


def load_lang_model(path, device="cpu"):
    """Our checkpoint (.safetensors) or an HF directory -> (model, tokenizer, meta)."""
    path = Path(path)
    if path.is_dir():
        return GPT.from_pretrained(path).to(device), load_tokenizer(path), {"args": {"tokenizer": str(path)}}
    model, meta = load_model(path, device)
    tok = meta["args"].get("tokenizer")
    if not tok:
        raise ValueError(f"{path}: checkpoint names no tokenizer")
    tok_path = Path(tok) if Path(tok).is_absolute() else path.parent / tok
    return model, load_tokenizer(tok_path), meta


def crop(prompts, block_size, max_new_tokens):
    """Prompts too long to leave min(max_new_tokens, 64, block_size // 2) tokens of room keep their last tokens, as
    nanoGPT crops its context (the action and the end of the page survive; the top of a long page is lost).
    -> (prompts, number cropped)"""
    keep = block_size - min(max_new_tokens, 64, block_size // 2)
    return [p[-keep:] for p in prompts], sum(len(p) > keep for p in prompts)


def generate_texts(model, tok, prompts, max_new_tokens, temperature=0.0, batch_size=64, generator=None, desc=None):
    """Decode completions of token-id prompts, in batches sorted by length (less padding). -> list of strings.
    A batch gets min(max_new_tokens, the room its longest prompt leaves in block_size) new tokens; see `crop`."""
    model.eval()
    prompts = crop(prompts, model.config.block_size, max_new_tokens)[0]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    for s in tqdm(range(0, len(order), batch_size), desc=desc, leave=False, disable=desc is None):
        ids = order[s:s + batch_size]
        room = model.config.block_size - max(len(prompts[i]) for i in ids)
        tokens, _ = model.generate([prompts[i] for i in ids], min(max_new_tokens, room), temperature=temperature,
                                   eos_id=tok.eos_id, generator=generator)
        for i, row in zip(ids, tokens.tolist()):
            out[i] = tok.decode([t for t in row if t >= 0 and t != tok.eos_id])
    return out


def summarize(per_record, changed):
    """List of per-record metric dicts -> each metric's mean overall, on changed and on unchanged records."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None
    out = {}
    for k in per_record[0]:
        out[k] = mean([m[k] for m in per_record])
        out[k + "_changed"] = mean([m[k] for m, c in zip(per_record, changed) if c])
        out[k + "_unchanged"] = mean([m[k] for m, c in zip(per_record, changed) if not c])
    return out


def eval_lang(task, model, tok, records, max_new_tokens=256, batch_size=64, sampled=True, pass_k=0, seed=0,
              desc="eval"):
    """Evaluate a language world model on records -> the eval JSON (see the module docstring)."""
    T = TASKS[task]
    prompts = [tok.encode(T.data.prompt_text(r)) for r in records]
    changed = [T.data.is_changed(r) for r in records]

    def score(texts):
        return [T.metrics(t, r) for t, r in zip(texts, records)]

    greedy = generate_texts(model, tok, prompts, max_new_tokens, 0.0, batch_size, desc=desc and desc + " greedy")
    res = dict(summarize(score(greedy), changed), n=len(records), n_changed=sum(changed),
               n_cropped=crop(prompts, model.config.block_size, max_new_tokens)[1],
               baseline_no_change=summarize(score([T.no_change] * len(records)), changed))
    g = torch.Generator().manual_seed(seed)
    if sampled:
        texts = generate_texts(model, tok, prompts, max_new_tokens, 1.0, batch_size, g, desc and desc + " T=1")
        res["sampled"] = summarize(score(texts), changed)
    if pass_k > 0:
        best = [-1.0] * len(records)
        for _ in range(pass_k):
            texts = generate_texts(model, tok, prompts, max_new_tokens, 1.0, batch_size, g, desc and desc + " pass@k")
            best = [max(b, m[T.headline]) for b, m in zip(best, score(texts))]
        res[f"pass@{pass_k}"] = summarize([{T.headline: b} for b in best], changed)
    res["examples"] = [dict(action=r["action"], changed=c, prediction=t)
                       for r, c, t in list(zip(records, changed, greedy))[:5]]
    return res


def fmt(x):
    return "     -" if x is None else f"{100 * x:6.2f}"


def print_table(task, rows, file=None):
    """rows: name -> eval JSON. Greedy headline metric overall / changed / unchanged, then T=1 and extras."""
    h = TASKS[task].headline
    extra = ["precision", "recall"] if task == "webpage" else []
    print(f"{'model (' + h + ' %)':<28} {'overall':>7} {'changed':>7} {'unchanged':>9} {'T=1':>6}"
          + "".join(f" {e:>9}" for e in extra), file=file)
    first = next(iter(rows.values()))
    for name, r in list(rows.items()) + [("always-no-change baseline", first["baseline_no_change"])]:
        s = r.get("sampled", {}).get(h)
        print(f"{name:<28} {fmt(r[h]):>7} {fmt(r[h + '_changed']):>7} {fmt(r[h + '_unchanged']):>9} {fmt(s):>6}"
              + "".join(f" {fmt(r[e]):>9}" for e in extra), file=file)


def main():
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="textgame")
    if pre.parse_known_args()[0].task == "video":  # decoded frames, not text: flags of its own (video_eval.py)
        from video_eval import main as video_main
        return video_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="textgame", choices=sorted(TASKS) + ["video"],
                   help="video: see python eval.py --task=video --help")
    p.add_argument("--ckpt", required=True, help="our .safetensors checkpoint or an HF model directory")
    p.add_argument("--compare", default=None, help="a second checkpoint, printed side by side")
    p.add_argument("--data", default=None, help="JSONL records (default: the embedded test split)")
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
    data = Path(args.data) if args.data else ROOT / "data" / args.task / "test.jsonl"
    if not data.is_file():
        sys.exit(f"error: --data {data}: file not found" + ("" if args.data else f" (run python data/{args.task}/prepare.py)"))
    try:
        records = T.data.load_records(data)[:args.limit or None]
        rows = {}
        for ck in [args.ckpt] + ([args.compare] if args.compare else []):
            model, tok, _ = load_lang_model(ck, args.device)
            rows[ck] = eval_lang(args.task, model, tok, records, args.max_new_tokens, args.batch_size, True,
                                 args.pass_k, args.seed, desc=Path(ck).name)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print_table(args.task, {Path(k).name: v for k, v in rows.items()})
    if args.pass_k:
        for k, v in rows.items():
            print(f"{Path(k).name}: pass@{args.pass_k} = {fmt(v[f'pass@{args.pass_k}'][T.headline])}")
    if args.json:
        result = rows[args.ckpt] if not args.compare else rows
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
