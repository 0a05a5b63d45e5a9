"""
The language tasks and what training needs of them: the registry (TASKS), loading a language world
model and its splits, decoding, RLVR's prompt pool, reward and probe, and the MLE stage on text and
its control (`train_mle`, `train_control`). docs/tasks.md adds a task: one module
(data/lights/task.py is the worked example) and one line in TASKS.
"""
import filecmp
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
from tqdm import tqdm

from checkpoint import ROOT, atomic_write, load_model, recorded_path
from data.lights import task as lights_task
from data.textgame import prepare as textgame_prepare, task as textgame_task
from data.webpage import prepare as webpage_prepare, task as webpage_task
from engine import generate
import mle
from rewards import reward_textgame, reward_webpage, score_textgame, score_webpage
from tokenizer_text import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class Task:
    """What the scripts need of a language task: text in, text out, a verifiable score of it."""
    # load_records(path) -> [record]; prompt_text(record), target_text(record) -> str (what the
    # model reads, what it must write); is_changed(record) -> bool (the action changes something)
    data: ModuleType
    prepare: ModuleType   # ensure_splits(data_dir): writes the missing train/val/test.jsonl
    score: Callable   # score(text, record) -> {metric: float}: one decoded answer's metrics
    headline: str     # the metric (a key of score's dict) of the tables, paired CIs and pass@k
    rewards: tuple    # the names RLVR's --reward takes; the first is the default
    reward: Callable  # reward(text, record, kind) -> float >= 0; never raises, whatever the text
    no_change: str    # the answer "nothing changes": right exactly on the unchanged records


def from_module(module):
    """A task written as one module (docs/tasks.md), defining Task's fields by their names."""
    return Task(data=module, prepare=module, score=module.score, headline=module.headline,
                rewards=module.rewards, reward=module.reward, no_change=module.no_change)


# the registry, --task's choices: one explicit line each, not a scan of data/*/ (read in one place)
TASKS = {
    "textgame": Task(data=textgame_task, prepare=textgame_prepare, score=score_textgame,
                     headline="accuracy", rewards=("binary", "task_specific"),
                     reward=reward_textgame, no_change='{"modified":[],"removed":[],"score":{}}'),
    "webpage": Task(data=webpage_task, prepare=webpage_prepare, score=score_webpage,
                    headline="f1", rewards=("f1",), reward=reward_webpage,
                    no_change="New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\nNone"),
    "lights": from_module(lights_task),   # the worked example of docs/tasks.md
}


# -----------------------------------------------------------------------------
# loading a language world model

def load_lang_model(path, device="cpu"):
    """Our checkpoint (naming its tokenizer file) or an HF directory -> (model, tokenizer, meta)."""
    model, meta = load_model(path, device)
    if not (tok := meta["args"].get("tokenizer")):
        raise ValueError(f"{path}: checkpoint names no tokenizer")
    # relative to the checkpoint's folder (an HF directory's meta names itself, absolute)
    return model, load_tokenizer(recorded_path(tok, Path(path).parent)), meta


def keep_tokenizer(init, meta, out_dir, write=True):
    """The tokenizer entry for the args of a run started from `init` (meta: load_lang_model's): an
    HF tokenizer's absolute path; ours is copied into out_dir (`write`: rank 0), self-contained."""
    src = recorded_path(meta["args"]["tokenizer"], Path(init).parent)   # relative, or absolute
    if src.is_dir():
        return str(src.resolve())
    dst = Path(out_dir) / (name := "tokenizer" + src.suffix)
    # copied when missing or another (a --resume=0 run from another --init)
    if write and not (dst.is_file() and filecmp.cmp(src, dst, shallow=False)):
        atomic_write(dst, lambda tmp: shutil.copyfile(src, tmp))
    return name


def scratch_tokenizer(run, texts, vocab_size, write=True):
    """--init=scratch's tokenizer: BPE trained on `texts` by rank 0, saved in out_dir and recorded
    in the checkpoints' args (`write` False, --stage=memory: not saved)."""
    if not write:
        return Tokenizer.train(texts, vocab_size)
    tok_file = run.out_dir / "tokenizer.tiktoken"
    if run.master and (not run.args.resume or not tok_file.is_file()):
        t0 = time.time()
        Tokenizer.train(texts, vocab_size).save(tok_file)   # written atomically
        run.print0(f"tokenizer: {vocab_size} BPE ranks in {time.time() - t0:.1f}s -> {tok_file}")
    run.barrier()   # the other ranks wait for rank 0's file
    run.recorded["tokenizer"] = str(tok_file)   # relative to the checkpoints' folder
    return Tokenizer.from_tiktoken_file(tok_file)


# -----------------------------------------------------------------------------
# the splits, and records as token ids

def load_splits(run, task, data_dir):
    """The train, val and test records of `data_dir` (run.fail names a missing or malformed file).
    Only data/<task> and data/<task>/cover are generated (rank 0) when holding none of the three."""
    files = [f"{s}.jsonl" for s in ("train", "val", "test")]
    missing = [f for f in files if not (data_dir / f).is_file()]
    own = ROOT / "data" / task
    if missing and data_dir.resolve() not in (own.resolve(), (own / "cover").resolve()):
        run.fail(f"--data_dir {data_dir}: missing {', '.join(missing)} (a data folder holds "
                 f"{', '.join(files)}; only data/{task} is generated when missing)")
    if 0 < len(missing) < len(files):
        run.fail(f"--data_dir {data_dir}: missing {', '.join(missing)}; the splits are generated "
                 f"all three at once: delete the others to have them generated again, or add these")
    run.barrier()   # every rank has looked before rank 0 writes
    if run.master and missing:
        TASKS[task].prepare.ensure_splits(data_dir)   # the seeded simulator's splits
    run.barrier()
    try:
        return [TASKS[task].data.load_records(data_dir / f) for f in files]
    except (OSError, ValueError) as e:   # a missing or malformed file: one line naming it
        run.fail(str(e))


def encode_pair(tok, prompt, answer):
    """A prompt text and its answer text -> (prompt ids, answer ids + EOS)."""
    return tok.prompt(prompt), tok.encode(answer) + [tok.eos_id]


def encode(task, tok, record):
    """A record of `task` -> encode_pair of its prompt and target texts."""
    data = TASKS[task].data
    return encode_pair(tok, data.prompt_text(record), data.target_text(record))


# -----------------------------------------------------------------------------
# decoding, and RLVR's probe

def crop(prompts, block_size, max_new_tokens):
    """Prompts keep the last tokens that leave min(max_new_tokens, 64, block_size // 2) new ones."""
    keep = block_size - min(max_new_tokens, 64, block_size // 2)
    return [p[-keep:] for p in prompts], sum(len(p) > keep for p in prompts)


def generate_texts(model, tok, prompts, max_new_tokens, temperature=0.0, batch_size=64,
                   generator=None, desc=None, share=None, position=None):
    """Decode completions of token-id prompts (`crop`ped), in batches sorted by length -> list of
    strings. share (greedy only; e.g. runtime.rank_map): computes the batches, as map does.
    desc: the progress bar's name (None: no bar), on line `position` (a forked worker's)."""
    model.eval()
    prompts = crop(prompts, model.config.block_size, max_new_tokens)[0]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]

    def decode(ids):   # one batch's texts
        room = model.config.block_size - max(len(prompts[i]) for i in ids)
        tokens, _ = generate(model, [prompts[i] for i in ids], min(max_new_tokens, room),
                             temperature, eos_id=tok.eos_id, generator=generator, vocab=tok.n_vocab)
        # generate pads finished rows with -1; the text stops before the end-of-sequence token
        return [tok.decode([t for t in row if 0 <= t != tok.eos_id]) for row in tokens.tolist()]

    out = [None] * len(prompts)
    bar = tqdm(batches, desc=desc, leave=False, disable=desc is None, position=position)
    for ids, texts in zip(batches, (share or map)(decode, bar)):
        for i, text in zip(ids, texts):
            out[i] = text
    return out


def probe_rewards(task, model, tok, prompts, records, kind, max_new_tokens, samples=4):
    """RLVR's probe: the mean training reward `kind` on fixed prompts, greedy and over `samples`
    samples each at T=1 (a fixed seed) -> dict(probe_greedy, probe_reward); ends in train mode."""
    def mean_reward(texts, recs):
        return sum(TASKS[task].reward(t, r, kind) for t, r in zip(texts, recs)) / len(texts)
    g = torch.Generator().manual_seed(0)
    greedy = generate_texts(model, tok, prompts, max_new_tokens)   # in eval mode, no gradients
    sampled = generate_texts(model, tok, prompts * samples, max_new_tokens, 1.0, generator=g)
    model.train()
    return dict(probe_greedy=mean_reward(greedy, records),
                probe_reward=mean_reward(sampled, records * samples))


# -----------------------------------------------------------------------------
# RLVR's prompts and reward

UNCHANGED_FRAC = 0.3          # share of RL prompts drawn from records where nothing changes
# --recipe=paper's schedule: run_text_game_rl.sh's total_epochs, sample_no_gold_data_num (changed
# records are its "gold" ones) per reward; run_web_agent_rl.sh: every train record once an epoch
PAPER_EPOCHS, PAPER_UNCHANGED = 15, {"binary": 7278, "task_specific": 1000}
PROBE_N, PROBE_EVERY = 64, 10   # RLVR's probe: fixed train prompts, measured every 10 steps

class PromptPool:
    """RLVR's prompt pool: the items whose prompt fits `room` tokens, changed or unchanged ones."""
    def __init__(self, items, prompt_text, is_changed, tok, room, unchanged_frac, generator):
        pool = [(x, prompt) for x in items if len(prompt := tok.prompt(prompt_text(x))) <= room]
        self.dropped = len(items) - len(pool)   # prompts longer than `room`
        self.changed = [x for x in pool if is_changed(x[0])]
        self.unchanged = [x for x in pool if not is_changed(x[0])]
        self.unchanged_frac, self.generator = unchanged_frac, generator

    def __call__(self, n):
        """n draws with replacement, unchanged_frac unchanged -> (token-id prompts, items)."""
        n_unch = round(n * self.unchanged_frac) if self.unchanged else 0
        picks = [self.changed[i] for i in
                 torch.randint(len(self.changed), (n - n_unch,), generator=self.generator)]
        picks += [self.unchanged[i] for i in   # (max: none to draw from is 0 draws, not an error)
                  torch.randint(max(len(self.unchanged), 1), (n_unch,), generator=self.generator)]
        return [x[1] for x in picks], [x[0] for x in picks]


class EpochSampler:
    """--recipe=paper's draw (verl's RandomSampler, drop_last): each epoch every changed prompt and
    n_unchanged random unchanged ones (None: each once), reshuffled -> this rank's n of a batch."""
    def __init__(self, pool, n_unchanged, seed, rank=0, world=1):
        self.pool, self.seed, self.rank, self.world, self.drawn = pool, seed, rank, world, 0
        self.every = n_unchanged is None or not pool.unchanged
        self.n_unch = len(pool.unchanged) if self.every else n_unchanged

    def __len__(self):
        return len(self.pool.changed) + self.n_unch

    def steps_per_epoch(self, n):   # drop_last
        return len(self) // (n * self.world)

    def __call__(self, n):
        epoch, b = divmod(self.drawn, max(self.steps_per_epoch(n), 1))
        self.drawn += 1
        g = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(self), generator=g)
        fill = torch.randint(max(len(self.pool.unchanged), 1), (len(self),), generator=g)
        C = len(self.pool.changed)
        picks = [self.pool.changed[i] if i < C else
                 self.pool.unchanged[i - C if self.every else int(fill[i])]
                 for i in order[(b * self.world + self.rank) * n:][:n].tolist()]
        return [x[1] for x in picks], [x[0] for x in picks]


def reward_fn(task, tok, kind):
    """grpo_step's reward: token lists -> the task's reward `kind` of each decoded answer."""
    def score(records, completions):
        texts = [tok.decode([t for t in c if t != tok.eos_id]) for c in completions]
        return [TASKS[task].reward(t, r, kind) for t, r in zip(texts, records)]
    return score


# -----------------------------------------------------------------------------
# the MLE stage on (prompt -> answer) pairs, loss on the answer tokens only (mle.py): train_lang's
# MLE, and the control (MLE continued from the RLVR start for RLVR's compute) of every text run

MLE_WEIGHT_DECAY = 0.1         # AdamW's weight decay in MLE and the control
EVAL_EVERY, VAL_N = 500, 200   # MLE's progress checks: every 500 steps, VAL_N val records greedy


def train_mle(run, task, tok, model, name, pairs, val_recs, steps, lr_of_step, max_new_tokens,
              budget=None):
    """mle.train on the `pairs` that fit, `steps` steps or RLVR's compute -> out_dir/<name>'s."""
    ckpt = run.out_dir / f"{name}.safetensors"   # resumable while it runs, the model once done

    def fits(pair):   # a whole (prompt, answer) pair fits the model's context
        return len(pair[0]) + len(pair[1]) <= model.config.block_size + 1

    keep = [pr for pr in pairs if fits(pr)]
    run.print0(f"{name}: {len(keep)}/{len(pairs)} train pairs fit block_size "
               f"{model.config.block_size}; {model.num_params() / 1e6:.2f}M non-embedding "
               f"parameters")
    if not keep:
        run.fail("no training pair fits the model's block_size (raise --block_size)")
    val_pairs = [pr for pr in (encode(task, tok, r) for r in val_recs[:256]) if fits(pr)]
    next_batch, val_loss = mle.pair_batches(run, keep, val_pairs, run.args.batch_size)
    data, headline = TASKS[task].data, TASKS[task].headline

    def val_metrics(model):   # rank 0: greedy decoding of the first VAL_N validation records
        if not run.master:
            return {}, ""
        recs = val_recs[:VAL_N]
        with run.autocast:   # each record's Task.score of the model's greedy answer
            texts = generate_texts(model, tok, [tok.prompt(data.prompt_text(r)) for r in recs],
                                   max_new_tokens)
        right = [TASKS[task].score(t, r)[headline] for t, r in zip(texts, recs)]
        changed = [x for x, r in zip(right, recs) if data.is_changed(r)]
        more = {"val": sum(right) / len(right),
                "val_changed": sum(changed) / len(changed) if changed else None}
        return more, f" val {headline} {more['val']:.3f}"

    until = " (until RLVR's compute)" if budget is not None else ""   # the progress bar's label
    mle.train(run, model, name, ckpt, steps, next_batch, val_loss, lr_of_step, budget,
              val_metrics, desc=name + until, weight_decay=MLE_WEIGHT_DECAY, eval_every=EVAL_EVERY)
    return ckpt


def train_control(run, task, tok, start, pairs, val_recs, budget, max_new_tokens, lr=None):
    """The control: MLE continued from the checkpoint `start` until it has used `budget`, at `lr`,
    by default the start's final MLE rate (else --rl_lr) -> out_dir/mle_more.safetensors."""
    final = mle.final_lr(start)
    lr = lr or (run.args.rl_lr if final is None else final)
    run.print0(f"control: MLE continued from the start at lr {lr:.3g} for RLVR's compute")
    model = load_model(start, run.device)[0]   # control_lr: 10 warm-up steps, then constant
    return train_mle(run, task, tok, model, "mle_more", pairs, val_recs, 10 ** 9,
                     mle.control_lr(lr), max_new_tokens, budget)
