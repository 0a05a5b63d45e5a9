"""
The language tasks, and how a world model is scored on one: the registry that train_lang.py, eval.py and the
experiments share, so that training never imports evaluation.

A task bundles its data module (load_records, prompt_text, target_text, is_changed), its split generator, the
per-record metrics of a decoded prediction (the verifiable rewards of rewards.py), the headline metric, the rewards
RLVR may use, and the answer "nothing changes" (the baseline that exposes fake gains).

`evaluate` decodes greedily (and optionally at T=1 and best-of-k) and returns the summary metrics overall, on the
records that change something (`_changed`) and on those that do not (`_unchanged`), plus `per_record`: one value per
record per metric, in file order, so two models evaluated on the same records can be compared *paired*
(`paired_bootstrap`: the mean difference with a bootstrap 95% interval over records).
"""
import shutil
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

from checkpoint import atomic_write, load_model
from data.textgame import prepare as textgame_prepare, task as textgame_task
from data.webpage import prepare as webpage_prepare, task as webpage_task
from engine import generate
from model import GPT
from rewards import textgame_reward, web_prf
from runtime import fork_map
from tokenizer_text import load_tokenizer


def score_textgame(text, record):
    """Exact next state (0/1) and the task-specific reward of one decoded prediction."""
    state, next_state = record["state"], record["next_state"]
    return {"accuracy": textgame_reward(text, state, next_state, "binary"),
            "task_specific": textgame_reward(text, state, next_state, "task_specific")}


def score_webpage(text, record):
    """Precision, recall and F1 of the predicted page changes against the true ones."""
    return dict(zip(("precision", "recall", "f1"), web_prf(text, webpage_task.target_text(record))))


TASKS = {
    "textgame": SimpleNamespace(
        data=textgame_task, prepare=textgame_prepare, score=score_textgame, headline="accuracy",
        rewards=("binary", "task_specific"), no_change='{"modified":[],"removed":[],"score":{}}',
        reward=lambda text, r, kind: textgame_reward(text, r["state"], r["next_state"], kind)),
    "webpage": SimpleNamespace(
        data=webpage_task, prepare=webpage_prepare, score=score_webpage, headline="f1", rewards=("f1",),
        no_change="New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\nNone",
        reward=lambda text, r, kind: web_prf(text, webpage_task.target_text(r))[2]),
}


def load_lang_model(path, device="cpu"):
    """Our checkpoint (.safetensors, naming its tokenizer file in its args) or an HF directory
    -> (model, tokenizer, meta)."""
    path = Path(path)
    if path.is_dir():
        return GPT.from_pretrained(path).to(device), load_tokenizer(path), {"args": {"tokenizer": str(path)}}
    model, meta = load_model(path, device)
    tok = meta["args"].get("tokenizer")
    if not tok:
        raise ValueError(f"{path}: checkpoint names no tokenizer")
    tok_path = Path(tok) if Path(tok).is_absolute() else path.parent / tok
    return model, load_tokenizer(tok_path), meta


def keep_tokenizer(init, meta, out_dir, write=True):
    """The tokenizer entry for the args of a run started from `init`, a checkpoint or HF directory whose metadata
    load_lang_model returned: an HF tokenizer stays in its directory (an absolute path); ours is copied beside the
    run's checkpoints (when `write`: rank 0 only), so out_dir is self-contained -> the entry (a path or a file name)."""
    src = meta["args"]["tokenizer"]   # relative to the checkpoint's folder, or absolute
    src = Path(src) if Path(src).is_absolute() else Path(init).parent / src
    if src.is_dir():
        return str(src.resolve())
    name = "tokenizer" + src.suffix
    if write and not (Path(out_dir) / name).is_file():
        atomic_write(Path(out_dir) / name, lambda tmp: shutil.copyfile(src, tmp))
    return name


# -----------------------------------------------------------------------------
# decoding

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
        tokens, _ = generate(model, [prompts[i] for i in ids], min(max_new_tokens, room), temperature=temperature,
                             eos_id=tok.eos_id, generator=generator)
        for i, row in zip(ids, tokens.tolist()):
            out[i] = tok.decode([t for t in row if t >= 0 and t != tok.eos_id])
    return out


class PromptPool:
    """RLVR's prompt pool: every record whose prompt is at most `room` tokens, split into those that change something
    (where the headroom is) and those that do not (mostly right already; drawn so "no change" stays right)."""

    def __init__(self, task, tok, records, room, unchanged_frac, generator):
        data = TASKS[task].data
        pool = [(r, prompt) for r in records if len(prompt := tok.encode(data.prompt_text(r))) <= room]
        self.changed = [x for x in pool if data.is_changed(x[0])]
        self.unchanged = [x for x in pool if not data.is_changed(x[0])]
        self.unchanged_frac, self.generator = unchanged_frac, generator

    def __call__(self, n):
        """n draws with replacement, a share unchanged_frac of them unchanged -> (token-id prompts, records)."""
        n_unch = round(n * self.unchanged_frac) if self.unchanged else 0
        picks = [self.changed[i] for i in torch.randint(len(self.changed), (n - n_unch,), generator=self.generator)]
        picks += [self.unchanged[i] for i in   # (max: none to draw from is 0 draws, not an error)
                  torch.randint(max(len(self.unchanged), 1), (n_unch,), generator=self.generator)]
        return [x[1] for x in picks], [x[0] for x in picks]


def probe_rewards(task, model, tok, prompts, records, kind, max_new_tokens, samples=4):
    """RLVR's probe: the mean training reward `kind` on fixed prompts, greedy and over `samples` samples each at T=1
    drawn from a fixed seed (the same stream at every call) -> dict(probe_greedy, probe_reward). Leaves the model in
    training mode."""
    def mean_reward(texts, recs):
        return sum(TASKS[task].reward(t, r, kind) for t, r in zip(texts, recs)) / len(texts)
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        greedy = generate_texts(model, tok, prompts, max_new_tokens)
        sampled = generate_texts(model, tok, prompts * samples, max_new_tokens, 1.0, generator=g)
    model.train()
    return dict(probe_greedy=mean_reward(greedy, records), probe_reward=mean_reward(sampled, records * samples))


# -----------------------------------------------------------------------------
# scoring

def summarize(per_record, changed):
    """List of per-record metric dicts -> each metric's mean overall, on changed and on unchanged records
    (None for an empty subset)."""
    def mean(xs):
        return sum(xs) / len(xs) if xs else None
    out = {}
    for k in per_record[0]:
        out[k] = mean([m[k] for m in per_record])
        out[k + "_changed"] = mean([m[k] for m, c in zip(per_record, changed) if c])
        out[k + "_unchanged"] = mean([m[k] for m, c in zip(per_record, changed) if not c])
    return out


def evaluate(task, model, tok, records, max_new_tokens=256, batch_size=64, sampled=False, pass_k=0, seed=0,
             desc="eval"):
    """Score a language world model on records -> summary metrics (greedy) with `per_record` lists, the
    always-no-change baseline, and optionally "sampled" (T=1) and "pass@k" (best of k samples at T=1)."""
    T = TASKS[task]
    prompts = [tok.encode(T.data.prompt_text(r)) for r in records]
    changed = [T.data.is_changed(r) for r in records]

    def score(texts):
        return [T.score(t, r) for t, r in zip(texts, records)]

    greedy = generate_texts(model, tok, prompts, max_new_tokens, 0.0, batch_size, desc=desc and desc + " greedy")
    scores = score(greedy)
    res = dict(summarize(scores, changed), n=len(records), n_changed=sum(changed),
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
    res["per_record"] = {k: [float(m[k]) for m in scores] for k in scores[0]} | {"changed": changed}
    return res


def evaluate_checkpoints(task, ckpts, tok, splits, max_new_tokens, device="cpu", autocast=None, workers=1):
    """Each checkpoint of {name: path} greedy on every split's records {split: records} (under `autocast`), so
    differences are paired per record -> {split: {name: evaluate's result}}. workers > 1 (CPU only): that many
    forked processes share the (checkpoint, split) jobs, largest first; every job computes what it would alone."""
    jobs = sorted(((name, split) for name in ckpts for split in splits), key=lambda j: -len(splits[j[1]]))

    def run(job):
        name, split = job
        with autocast or nullcontext():
            return evaluate(task, load_lang_model(ckpts[name], device)[0], tok, splits[split], max_new_tokens,
                            desc=f"{split} {name}" if workers <= 1 else None)   # forked workers: no bars

    outs = fork_map(run, jobs, workers)
    results = {split: {} for split in splits}
    for name in ckpts:   # in the checkpoints' order, whatever order the jobs ran in
        for split in splits:
            results[split][name] = outs[jobs.index((name, split))]
    return results


def paired_bootstrap(a, b, n_boot=10000, seed=0):
    """Mean of a - b over paired records and its bootstrap 95% interval (records resampled with replacement)
    -> (mean difference, low, high)."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) == 0:
        return None, None, None
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))  # (n_boot, n) resampled records
    means = d[idx].mean(1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_table(rows, metric, against, subsets=("all", "changed")):
    """Paired differences `name - against` of one per-record metric for every other model in rows (name -> evaluate
    result), overall and on changed records -> list of (name, subset, mean, low, high)."""
    base = rows[against]["per_record"]
    out = []
    for name, r in rows.items():
        if name == against:
            continue
        pr = r["per_record"]
        for sub in subsets:
            keep = [sub == "all" or c for c in base["changed"]]
            a = [x for x, k in zip(pr[metric], keep) if k]
            b = [x for x, k in zip(base[metric], keep) if k]
            out.append((name, sub, *paired_bootstrap(a, b)))
    return out


# -----------------------------------------------------------------------------
# printing

def pct(x):
    return "     -" if x is None else f"{100 * x:6.2f}"


def print_table(task, rows, file=None):
    """rows: name -> evaluate result. Greedy headline metric overall / changed / unchanged, then T=1 and extras,
    then the always-no-change baseline."""
    h = TASKS[task].headline
    extra = ["precision", "recall"] if task == "webpage" else []
    print(f"{'model (' + h + ' %)':<28} {'overall':>7} {'changed':>7} {'unchanged':>9} {'T=1':>6}"
          + "".join(f" {e:>9}" for e in extra), file=file)
    first = next(iter(rows.values()))
    for name, r in list(rows.items()) + [("always-no-change baseline", first["baseline_no_change"])]:
        s = r.get("sampled", {}).get(h)
        print(f"{name:<28} {pct(r[h]):>7} {pct(r[h + '_changed']):>7} {pct(r[h + '_unchanged']):>9} {pct(s):>6}"
              + "".join(f" {pct(r[e]):>9}" for e in extra), file=file)


def print_paired(task, rows, against, file=None):
    """Paired differences of the headline metric against model `against`, in points, with bootstrap 95% intervals."""
    h = TASKS[task].headline
    print(f"paired differences in {h} (points, bootstrap 95% CI over the same records):", file=file)
    for name, sub, m, lo, hi in paired_table(rows, h, against):
        if m is not None:
            sig = "  *" if lo > 0 or hi < 0 else ""
            print(f"  {name + ' - ' + against:<22} {sub:<8} {100 * m:+6.2f}  [{100 * lo:+6.2f}, {100 * hi:+6.2f}]{sig}",
                  file=file)


def print_comparison(task, split, rows, file=None):
    """train_lang.py's report of one split (rows: name -> evaluate result, "mle" among them): the table, then the
    paired differences against the MLE start and, when the control ran, against the control ("mle_more")."""
    print(f"\n{split} split ({rows['mle']['n']} transitions, {rows['mle']['n_changed']} changed), "
          f"{TASKS[task].headline} % (greedy):", file=file, flush=True)
    print_table(task, rows, file)
    print_paired(task, rows, "mle", file)
    if "mle_more" in rows:
        print_paired(task, {k: v for k, v in rows.items() if k != "mle"}, "mle_more", file)
