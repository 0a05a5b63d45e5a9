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
from itertools import islice
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
from tqdm import tqdm

from checkpoint import ROOT, atomic_write, load_model, read_meta, recorded_path, save_config
from data.lights import task as lights_task
from data.textgame import prepare as textgame_prepare, task as textgame_task
from data.webpage import prepare as webpage_prepare, task as webpage_task
from engine import generate
from grpo import HEADROOM_N, headroom
import mle
from model import GPT, GPTConfig
from rewards import TEXTGAME_KINDS, reward_textgame, reward_webpage, score_textgame, score_webpage
from runtime import unsharded
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
                     headline="accuracy", rewards=TEXTGAME_KINDS,
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


def check_inputs(run, args):
    """train_lang.py's flags checked by the run, before any write -> --init is a checkpoint?"""
    rewards = TASKS[args.task].rewards
    is_ckpt = args.init != "scratch" and Path(args.init).is_file()
    if args.prompts_per_step % run.world:   # the global count: whole groups on each rank
        run.fail(f"--prompts_per_step {args.prompts_per_step}: a multiple of the {run.world} ranks")
    if args.reward not in rewards:
        run.fail(f"--reward {args.reward}: the {args.task} task has rewards {rewards}")
    if args.init != "scratch" and not Path(args.init).exists():
        run.fail(f"--init {args.init}: no such checkpoint file or HF directory")
    if args.stage == "rlvr" and args.init == "scratch":
        run.fail("--stage=rlvr needs --init=<checkpoint or HF dir>: it post-trains a model")
    if is_ckpt and "vq" in run.or_fail(read_meta, args.init)["args"]:   # train_video.py's
        run.fail(f"--init {args.init}: a video world model of train_video.py (its tokens are frame "
                 f"codes, not text); start from a train_lang.py checkpoint or an HF directory")
    return is_ckpt


def load_start(run, args, train_recs, vocab_size, record):
    """--init's (model, tokenizer), loaded before config.json (`record`) is written; scratch: a
    BPE on the train records after it, and a new GPT of the flags' shape."""
    if args.init != "scratch":
        try:
            model, tok, meta = load_lang_model(args.init, run.load_device)
        except ValueError as e:
            run.fail(str(e))
        except (OSError, KeyError, TypeError) as e:   # e.g. an HF config.json without a key
            run.fail(f"--init {args.init}: cannot load ({type(e).__name__}: {e})")
    save_config(run, record)   # the inputs are good; from here on the run writes
    if args.init == "scratch":
        data = TASKS[args.task].data
        texts = [data.prompt_text(r) + data.target_text(r) for r in train_recs]
        tok = scratch_tokenizer(run, texts, vocab_size, bool(record))
        return GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=args.block_size,
                                   n_layer=args.n_layer, n_head=args.n_embd // 32,
                                   n_embd=args.n_embd)), tok
    # the tokenizer: HF, its directory; ours, a copy beside the run's checkpoints
    kept = keep_tokenizer(args.init, meta, run.out_dir, write=run.master and bool(record))
    run.recorded["tokenizer"] = str(run.out_dir / kept)
    run.print0(f"init: {args.init} ({model.num_params() / 1e6:.2f}M non-embedding parameters)")
    return model, tok


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

    bar = tqdm(batches, desc=desc, leave=False, disable=desc is None, position=position)
    texts = [text for batch in (share or map)(decode, bar) for text in batch]   # in `order`
    return [text for _, text in sorted(zip(order, texts))]   # in the prompts' order


def probe_rewards(task, model, tok, prompts, records, kind, max_new_tokens, samples=4):
    """RLVR's probe: the mean training reward `kind` on fixed prompts, greedy and over `samples`
    samples each at T=1 (a fixed seed) -> dict(probe_greedy, probe_reward); ends in train mode."""
    def mean_reward(texts, recs):
        return sum(TASKS[task].reward(t, r, kind) for t, r in zip(texts, recs)) / len(texts)
    g = torch.Generator().manual_seed(0)
    greedy = generate_texts(model, tok, prompts, max_new_tokens, desc="probe greedy")   # eval mode
    sampled = generate_texts(model, tok, prompts * samples, max_new_tokens, 1.0, generator=g,
                             desc="probe T=1")
    model.train()
    return dict(probe_greedy=mean_reward(greedy, records),
                probe_reward=mean_reward(sampled, records * samples))


# -----------------------------------------------------------------------------
# RLVR's prompts and reward

UNCHANGED_FRAC = 0.3          # share of RL prompts drawn from records where nothing changes
# --recipe=paper's schedule: run_text_game_rl.sh's total_epochs, sample_no_gold_data_num per reward
# beside its "gold" records (PAPER_GOLD); run_web_agent_rl.sh: every train record once an epoch
PAPER_EPOCHS, PAPER_UNCHANGED = 15, {"binary": 7278, "task_specific": 1000}
PAPER_GOLD = {"textgame": textgame_task.is_gold}
PROBE_N, PROBE_EVERY = 64, 10   # RLVR's probe: fixed train prompts, measured every 10 steps

class PromptPool:
    """RLVR's prompt pool: the records whose prompt fits `longest` tokens, changed or unchanged."""
    def __init__(self, records, prompt_text, is_changed, tok, longest, unchanged_frac, generator):
        pool = [(x, p) for x in records if len(p := tok.prompt(prompt_text(x))) <= longest]
        self.dropped = len(records) - len(pool)   # prompts longer than `longest`
        self.changed = [x for x in pool if is_changed(x[0])]
        self.unchanged = [x for x in pool if not is_changed(x[0])]
        self.unchanged_frac, self.generator = unchanged_frac, generator

    def __call__(self, n):
        """n draws with replacement, unchanged_frac unchanged -> (token-id prompts, records)."""
        n_unch = round(n * self.unchanged_frac) if self.unchanged else 0
        picks = [self.changed[i] for i in
                 torch.randint(len(self.changed), (n - n_unch,), generator=self.generator)]
        picks += [self.unchanged[i] for i in   # (max: none to draw from is 0 draws, not an error)
                  torch.randint(max(len(self.unchanged), 1), (n_unch,), generator=self.generator)]
        return [x[1] for x in picks], [x[0] for x in picks]


class EpochSampler:
    """--recipe=paper's draw (verl's RandomSampler, drop_last): each epoch every changed prompt and
    n_unchanged random unchanged ones (None: each once), reshuffled -> this rank's n of a batch."""
    def __init__(self, pool, n_unchanged, seed, rank=0, world=1, drawn=0):
        self.pool, self.seed, self.rank, self.world = pool, seed, rank, world
        self.drawn = drawn   # batches drawn so far (a resumed run's steps)
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


class RLPrompts:
    """train_lang.py's RLVR prompts of at most `longest` tokens: `pool` (drawn with `generator`),
    `probe` (train, scored every PROBE_EVERY steps), `held_out` (val, the headroom line's)."""
    def __init__(self, run, args, tok, train_recs, val_recs, longest, cfg, generator):
        self.run, self.args, self.tok, self.cfg = run, args, tok, cfg
        data = TASKS[args.task].data   # the recipe's "changed" records: the official gold ones
        changed = (args.recipe == "paper" and PAPER_GOLD.get(args.task)) or data.is_changed
        self.pool = PromptPool(train_recs, data.prompt_text, changed, tok, longest,
                               UNCHANGED_FRAC, generator)
        self.probe = self.pool(PROBE_N)
        fits = ((p, r) for r in val_recs if len(p := tok.prompt(data.prompt_text(r))) <= longest)
        self.held_out = [list(x) for x in zip(*islice(fits, HEADROOM_N))]   # or []
        run.print0(f"rlvr: {len(self.pool.changed)} changed + {len(self.pool.unchanged)} unchanged "
                   f"prompts ({self.pool.dropped} over {longest} tokens left out); per step "
                   f"{cfg.prompts_per_step * run.world} prompts in all, {cfg.prompts_per_step} per "
                   f"rank, groups with spread (<= {cfg.max_rounds} rounds) x {cfg.group_size}")

    def schedule(self, step):
        """-> (draw(n): a step's prompts and records from `step` on, the run's steps): the pool's
        draws with replacement and --rl_steps, or --recipe=paper's epochs (EpochSampler)."""
        run, args, pool = self.run, self.args, self.pool
        if args.recipe != "paper":
            return pool, args.rl_steps
        draw = EpochSampler(pool, PAPER_UNCHANGED.get(args.reward), args.seed, run.rank, run.world,
                            drawn=step)
        if not (per_epoch := draw.steps_per_epoch(self.cfg.prompts_per_step)):
            run.fail(f"--recipe=paper: {len(draw)} prompts, fewer than a step's")
        steps = args.rl_steps or PAPER_EPOCHS * per_epoch   # --rl_steps=0: the epochs
        run.print0(f"--recipe=paper: epochs of {len(draw)} prompts, {len(pool.changed)} changed + "
                   f"{draw.n_unch} unchanged, reshuffled; {steps} steps ({PAPER_EPOCHS} epochs)")
        return draw, steps

    def score_probe(self, model):
        """The probe's rewards, greedy and T=1: every rank gathers FSDP's weights, rank 0 scores."""
        with unsharded(model), self.run.autocast:
            return probe_rewards(self.args.task, model, self.tok, *self.probe, self.args.reward,
                                 self.cfg.max_new_tokens) if self.run.master else {}

    def headroom(self, model, env, name):
        """grpo.headroom's line on `held_out`: every rank gathers FSDP's weights, rank 0 prints."""
        with unsharded(model):
            return headroom(model, *self.held_out, env, self.cfg, self.run.autocast, name,
                            f"{self.args.reward} reward x 100") if self.run.master and \
                self.held_out else {}


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
    model = load_model(start, run.load_device)[0]   # control_lr: 10 warm-up steps, then constant
    return train_mle(run, task, tok, model, "mle_more", pairs, val_recs, 10 ** 9,
                     mle.control_lr(lr), max_new_tokens, budget)
