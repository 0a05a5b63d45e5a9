"""
The language tasks and what RLVR needs of them: the registry that train_lang.py, eval.py and the
experiments share, loading a language world model, decoding, RLVR's probe, and k-step
imagination's chains (RLVR's rollout hooks for them included).

A task (`Task`, registered in TASKS) bundles its data module (load_records, prompt_text,
target_text, is_changed), its split generator, the per-record metrics of a decoded prediction, the
headline metric, the rewards RLVR may use and the reward itself (for the text game and the web page
rewards.py's score_<task> and reward_<task>: the verifiable rewards) and the answer "nothing
changes" (the baseline that exposes fake gains). CHAINING adds, for the tasks with k-step
imagination (train_lang.py --horizon), how a state follows from an answer. Scoring whole splits is
evaluate_lang.py's job; comparing two models is stats.py's. docs/tasks.md adds a task: one module
(data/lights/task.py is the worked example) and one line in TASKS.
"""
import filecmp
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
from tqdm import tqdm

from checkpoint import atomic_write, load_model
from data.lights import task as lights_task
from data.textgame import prepare as textgame_prepare, task as textgame_task
from data.webpage import prepare as webpage_prepare, task as webpage_task
from engine import generate
from model import GPT
from load_hf import load_tokenizer
from rewards import (apply_diff, parse_diff, parse_sections, reward_textgame, reward_webpage,
                     score_textgame, score_webpage)


@dataclass(frozen=True)
class Chaining:
    """What k-step imagination needs of a task: a chain is K consecutive recorded transitions of
    one episode, each step after the first prompted with the state the previous answer leads to."""
    state: str        # the record's key of the state a step starts from ("state", "observation")
    next_state: str   # the record's key of the state it leads to; record j+1 continues record j
                      # when its `state` is j's `next_state` and its other context keys are equal
    # imagine(text, record) -> the state the answer `text` leads to from the record's state, or
    # None when the answer cannot be read (the chain ends there, wrong)
    imagine: Callable
    # True: the last answer is scored on its imagined record (the imagined final state must be the
    # true one); False: on the recorded one (the last predicted changes against the true ones)
    judge_imagined: bool


@dataclass(frozen=True)
class Task:
    """What the training, evaluation and experiment scripts need of a language task: text in, text
    out, and a verifiable score of the text out."""
    # load_records(path) -> [record]; prompt_text(record), target_text(record) -> str (what the
    # model reads, what it must write); is_changed(record) -> bool (the action changes something)
    data: ModuleType
    # ensure_splits(data_dir, n_train=, n_val=, n_test=, seed=, verbose=): writes the missing
    # train/val/test.jsonl of data_dir from a seeded generator -> {split: path}
    prepare: ModuleType
    score: Callable   # score(text, record) -> {metric: float}: one decoded answer's metrics
    headline: str     # the metric (a key of score's dict) of the tables, paired CIs and pass@k
    rewards: tuple    # the names RLVR's --reward takes; the first is the default
    reward: Callable  # reward(text, record, kind) -> float >= 0, highest for the target text;
                      # kind in rewards; never raises, whatever the text
    no_change: str    # the answer "nothing changes": right exactly on the unchanged records


def from_module(module):
    """A task written as one module (docs/tasks.md): the module is its data and its split
    generator, and defines score, headline, rewards, reward and no_change under those names."""
    return Task(data=module, prepare=module, score=module.score, headline=module.headline,
                rewards=module.rewards, reward=module.reward, no_change=module.no_change)


def imagine_textgame(text, record):
    """The state the predicted diff leads to: merged into the record's state; None if unreadable."""
    diff = parse_diff(text)
    return None if diff is None else apply_diff(record["state"], diff)


def imagine_webpage(text, record):
    """The page the predicted changes lead to: merged into the record's page (always readable)."""
    return webpage_task.apply_changes(record["observation"], parse_sections(text))


# the registry: --task's choices. A new task is one module and one line here (docs/tasks.md); an
# explicit line, not a scan of data/*/, so the choices are read in one place and an import error
# points here.
TASKS = {
    "textgame": Task(data=textgame_task, prepare=textgame_prepare, score=score_textgame,
                     headline="accuracy", rewards=("binary", "task_specific"),
                     reward=reward_textgame, no_change='{"modified":[],"removed":[],"score":{}}'),
    "webpage": Task(data=webpage_task, prepare=webpage_prepare, score=score_webpage,
                    headline="f1", rewards=("f1",), reward=reward_webpage,
                    no_change="New items:\nNone\n\nDeleted items:\nNone\n\nUpdated items:\nNone"),
    "lights": from_module(lights_task),   # the worked example of docs/tasks.md
}
# the tasks with k-step imagination (train_lang.py --horizon): how a state follows from an answer
CHAINING = {
    "textgame": Chaining("state", "next_state", imagine_textgame, judge_imagined=True),
    "webpage": Chaining("observation", "next_observation", imagine_webpage, judge_imagined=False),
}


# -----------------------------------------------------------------------------
# loading a language world model

def load_lang_model(path, device="cpu"):
    """Our checkpoint (.safetensors, naming its tokenizer file in its args) or an HF directory
    -> (model, tokenizer, meta)."""
    path = Path(path)
    if path.is_dir():
        meta = {"args": {"tokenizer": str(path)}}
        return GPT.from_pretrained(path, device=device), load_tokenizer(path), meta
    model, meta = load_model(path, device)
    tok = meta["args"].get("tokenizer")
    if not tok:
        raise ValueError(f"{path}: checkpoint names no tokenizer")
    # a relative tokenizer path is relative to the checkpoint's folder
    tok_path = Path(tok) if Path(tok).is_absolute() else path.parent / tok
    return model, load_tokenizer(tok_path), meta


def keep_tokenizer(init, meta, out_dir, write=True):
    """The tokenizer entry for the args of a run started from `init`, a checkpoint or HF directory
    whose metadata load_lang_model returned: an HF tokenizer stays in its directory (an absolute
    path); ours is copied beside the run's checkpoints (when `write`: rank 0 only), so out_dir is
    self-contained -> the entry (a path or a file name)."""
    src = meta["args"]["tokenizer"]   # relative to the checkpoint's folder, or absolute
    src = Path(src) if Path(src).is_absolute() else Path(init).parent / src
    if src.is_dir():
        return str(src.resolve())
    name = "tokenizer" + src.suffix
    dst = Path(out_dir) / name
    # copied when missing or another (a --resume=0 run from another --init)
    if write and not (dst.is_file() and filecmp.cmp(src, dst, shallow=False)):
        atomic_write(dst, lambda tmp: shutil.copyfile(src, tmp))
    return name


# -----------------------------------------------------------------------------
# decoding

def crop(prompts, block_size, max_new_tokens):
    """Prompts too long to leave min(max_new_tokens, 64, block_size // 2) tokens of room keep their
    last tokens, as nanoGPT crops its context (the action and the end of the page survive; the top
    of a long page is lost). -> (prompts, number cropped)"""
    keep = block_size - min(max_new_tokens, 64, block_size // 2)
    return [p[-keep:] for p in prompts], sum(len(p) > keep for p in prompts)


def generate_texts(model, tok, prompts, max_new_tokens, temperature=0.0, batch_size=64,
                   generator=None, desc=None, share=None):
    """Decode completions of token-id prompts, in batches sorted by length (less padding).
    -> list of strings. A batch gets min(max_new_tokens, the room its longest prompt leaves in
    block_size) new tokens; see `crop`. share (greedy only; e.g. runtime.rank_map): computes the
    batches, as map(decode, batches) would; the batches are the same whoever computes them."""
    model.eval()
    prompts = crop(prompts, model.config.block_size, max_new_tokens)[0]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]

    def decode(ids):   # one batch's texts
        room = model.config.block_size - max(len(prompts[i]) for i in ids)
        tokens, _ = generate(model, [prompts[i] for i in ids], min(max_new_tokens, room),
                             temperature=temperature, eos_id=tok.eos_id, generator=generator,
                             vocab=tok.n_vocab)
        # generate pads finished rows with -1; the text stops before the end-of-sequence token
        return [tok.decode([t for t in row if t >= 0 and t != tok.eos_id])
                for row in tokens.tolist()]

    out = [None] * len(prompts)
    bar = tqdm(batches, desc=desc, leave=False, disable=desc is None)
    for ids, texts in zip(batches, (share or map)(decode, bar)):
        for i, text in zip(ids, texts):
            out[i] = text
    return out


# -----------------------------------------------------------------------------
# RLVR's probe

def probe_rewards(task, model, tok, prompts, records, kind, max_new_tokens, samples=4):
    """RLVR's probe: the mean training reward `kind` on fixed prompts, greedy and over `samples`
    samples each at T=1 drawn from a fixed seed (the same stream at every call)
    -> dict(probe_greedy, probe_reward). Leaves the model in training mode."""
    def mean_reward(texts, recs):
        return sum(TASKS[task].reward(t, r, kind) for t, r in zip(texts, recs)) / len(texts)
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        greedy = generate_texts(model, tok, prompts, max_new_tokens)
        sampled = generate_texts(model, tok, prompts * samples, max_new_tokens, 1.0, generator=g)
    model.train()
    return dict(probe_greedy=mean_reward(greedy, records),
                probe_reward=mean_reward(sampled, records * samples))


# -----------------------------------------------------------------------------
# k-step imagination: chains of recorded steps, each later step prompted with an imagined state

def episode_chains(task, records, horizon):
    """Every run of `horizon` consecutive transitions of one episode in `records`, one per start
    record, in file order -> list of chains (lists of records). Record j+1 continues record j when
    its state is j's next state and its other context (game, site) is j's; the simulators' splits
    hold their episodes one after another, so these are exactly the episodes' runs
    (tests/test_imagination.py)."""
    if task not in CHAINING:
        raise ValueError(f"the {task} task has no k-step imagination (tasks.CHAINING)")
    c = CHAINING[task]

    def context(r):   # what must not change along an episode: all but the states and the action
        return {k: v for k, v in r.items() if k not in (c.state, c.next_state, "action")}

    follows = [a[c.next_state] == b[c.state] and context(a) == context(b)
               for a, b in zip(records, records[1:])]
    return [records[i:i + horizon] for i in range(len(records) - horizon + 1)
            if all(follows[i:i + horizon - 1])]


def imagine_chains(task, chains, predict):
    """K-step imagination: step 1 of each chain reads its recorded state, each later step the state
    the chain's previous answer leads to (Chaining.imagine) with the next recorded action.
    predict(step records) -> [(text, payload)], the answers (payload: whatever the caller wants
    back, e.g. sampled tokens; text None: no answer) -> per chain its steps [(record prompted,
    text, payload)]: K of them, fewer when an answer was unreadable or missing (the chain ends)."""
    c = CHAINING[task]
    steps = [[] for _ in chains]
    live = [(i, ch[0]) for i, ch in enumerate(chains)]   # (chain, the record its next step reads)
    for k in range(max(map(len, chains), default=0)):
        answers = predict([r for _, r in live]) if live else []
        following = []
        for (i, r), (text, payload) in zip(live, answers):
            if text is None:
                continue
            steps[i].append((r, text, payload))
            if k + 1 < len(chains[i]) and (state := c.imagine(text, r)) is not None:
                following.append((i, {**chains[i][k + 1], c.state: state}))
        live = following
    return steps


def scored_on(task, chain, k, record):
    """The record step k's answer is scored on, given the record it was prompted with: that
    imagined record, or the recorded step (Chaining.judge_imagined)."""
    return record if CHAINING[task].judge_imagined else chain[k]


def judged(task, chain, steps):
    """The chain's last answer and the record it is scored on (scored_on) -> (text, record), or
    None when the chain ended early."""
    if len(steps) < len(chain):
        return None
    record, text, _ = steps[-1]
    return text, scored_on(task, chain, len(chain) - 1, record)


def chain_reward(task, chain, steps, kind):
    """RLVR's reward of an imagined chain: reward `kind` of its last answer; 0 if it ended early."""
    j = judged(task, chain, steps)
    return 0.0 if j is None else TASKS[task].reward(*j, kind)


def step_rewards(task, chain, steps, kind):
    """Each step's own reward `kind`: step k's answer scored as chain_reward scores the last one
    (on the record scored_on gives) -> K floats, 0 for a step the chain did not reach."""
    rewards = [TASKS[task].reward(text, scored_on(task, chain, k, r), kind)
               for k, (r, text, _) in enumerate(steps)]
    return rewards + [0.0] * (len(chain) - len(steps))


def rewards_to_go(rewards):
    """Per step k the mean of the step rewards from k to the last: what step k's answer can still
    change (the answers before it are already given) -> K floats."""
    K = len(rewards)
    return [sum(rewards[k:]) / (K - k) for k in range(K)]


def text_predictor(model, tok, task, max_new_tokens, temperature=0.0, generator=None,
                   share=None):
    """predict for imagine_chains: generate_texts on the records' prompts (cropped as there;
    share: as there)."""
    data = TASKS[task].data

    def predict(records):
        prompts = [tok.encode(data.prompt_text(r)) for r in records]
        texts = generate_texts(model, tok, prompts, max_new_tokens, temperature,
                               generator=generator, share=share)
        return [(t, None) for t in texts]
    return predict


def imagined_pairs(task, model, tok, chains, max_new_tokens):
    """The stronger control's data (train_lang.py --control_imagined): the start model imagines
    each chain greedily, as the evaluation does, and every step after the first becomes an MLE
    pair: the prompt of the state it imagined, and the answer the chain's metric counts right
    there (scored_on: text game, the diff from the imagined state to the true next state, so
    the imagined chain returns to the truth; web page, the recorded changes) -> (pairs of
    (prompt text, answer text), the imagination's cost in forward-token units (prompt and answer
    tokens of every step, as grpo.compute_used counts a rollout), chains that ended early)."""
    data = TASKS[task].data
    steps = imagine_chains(task, chains, text_predictor(model, tok, task, max_new_tokens))
    pairs, cost = [], 0
    for chain, s in zip(chains, steps):
        for k, (record, text, _) in enumerate(s):
            cost += len(tok.encode(data.prompt_text(record))) + len(tok.encode(text)) + 1
            if k > 0:
                truth = scored_on(task, chain, k, record)
                pairs.append((data.prompt_text(record), data.target_text(truth)))
    return pairs, cost, sum(len(s) < len(ch) for ch, s in zip(chains, steps))


def sample_chains(task, model, tok, chains, max_new_tokens, temperature, room, generator):
    """RLVR's chain rollout: every step of every chain sampled at `temperature` in one batch per
    step; a step whose prompt exceeds `room` tokens ends its chain -> imagine_chains' steps, each
    payload (prompt ids, answer ids with EOS if written, their log-probs)."""
    data = TASKS[task].data

    def predict(records):
        prompts = [tok.encode(data.prompt_text(r)) for r in records]
        fit = [i for i, p in enumerate(prompts) if len(p) <= room]
        out = [(None, None)] * len(records)
        if not fit:
            return out
        tokens, logp = generate(model, [prompts[i] for i in fit], max_new_tokens,
                                temperature=temperature, eos_id=tok.eos_id, generator=generator,
                                vocab=tok.n_vocab)
        for i, row, lp in zip(fit, tokens.tolist(), logp.tolist()):
            ids = [t for t in row if t >= 0]   # -1 pads after EOS
            out[i] = (tok.decode([t for t in ids if t != tok.eos_id]), (prompts[i], ids,
                                                                          lp[:len(ids)]))
        return out
    return imagine_chains(task, chains, predict)


def chain_hooks(task, tok, draw, room, horizon, group_size, kind, per_step=False):
    """grpo_step's hooks for RLVR on chains of K = `horizon` steps (train_lang.py --horizon=K > 1)
    -> (draw, sampler, reward_fn); `draw(n)` is the prompt pool's (first prompts, chains). Each
    chain start's G = `group_size` chains are sampled at the config's temperature (every step:
    sample_chains, no prompt over `room` tokens) and laid out as K x G rows: row = one step, its
    prompt less the first token as input only, then its sampled answer, trained on. A step a chain
    did not reach is an empty row. The group's prompt is the first token, the one every prompt of
    the task begins with. The rows' rewards and groups:
    - per_step False: one GRPO group per start (group size K x G); every row of a chain carries
      the chain's reward `kind` (chain_reward), so the advantages are the chains';
    - per_step True: K groups per start, one per step (group size G); step k's row carries the
      chain's mean reward from step k on (rewards_to_go of step_rewards), so an answer is judged
      by what follows from it, against the other chains' answers at the same step."""
    K, G = horizon, group_size
    scored = []   # the rewards of the sampler's last rows, handed to grpo.py by reward_fn

    def draw_starts(n):   # n groups: the pool's chains, each with its first prompt's first token
        prompts, starts = draw(math.ceil(n / K) if per_step else n)
        reps = K if per_step else 1   # a start's groups
        firsts = [p[:1] for p in prompts for _ in range(reps)]
        return firsts, [c for c in starts for _ in range(reps)]

    def sampler(model, prompts, items, cfg, generator):   # grpo.rollout's hook
        starts, first = items[::K * G], prompts[::K * G]   # each start's K x G rows
        chains = [c for c in starts for _ in range(G)]
        steps = sample_chains(task, model, tok, chains, cfg.max_new_tokens, cfg.temperature, room,
                              generator)
        rows = []   # (token ids, their log-probs, sampled or input only)
        scored.clear()
        for i in range(len(starts)):
            cells = []   # (step k, chain g, its prompt and answer, its reward)
            for g in range(G):
                c, s = chains[i * G + g], steps[i * G + g]
                answers = [x[2] for x in s] + [(first[i], [], [])] * (K - len(s))
                if per_step:
                    rewards = rewards_to_go(step_rewards(task, c, s, kind))
                else:
                    rewards = [chain_reward(task, c, s, kind)] * K
                cells += [(k, g, answers[k], rewards[k]) for k in range(K)]
            if per_step:   # step-major: a group is one step's G answers
                cells.sort(key=lambda cell: cell[:2])
            for _, _, (prompt, ids, lp), reward in cells:
                if prompt[:1] != first[i]:
                    raise ValueError(f"--horizon: a {task} prompt does not begin with the "
                                     f"first token of the others")
                n = len(prompt) - 1
                rows.append((prompt[1:] + ids, [0.0] * n + lp, [False] * n + [True] * len(ids)))
                scored.append(reward)
        T = max(len(ids) for ids, _, _ in rows)
        tokens = torch.full((len(rows), T), -1, dtype=torch.long)
        logp, sampled = torch.zeros(len(rows), T), torch.zeros(len(rows), T, dtype=torch.bool)
        for i, (ids, lp, sm) in enumerate(rows):
            tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            logp[i, :len(ids)] = torch.tensor(lp)
            sampled[i, :len(ids)] = torch.tensor(sm, dtype=torch.bool)
        return tokens, logp, sampled

    def reward_fn(items, completions):   # the rows' rewards, as the sampler scored them
        assert len(scored) == len(completions), "reward_fn: not the sampler's last rows"
        return list(scored)

    return draw_starts, sampler, reward_fn


def probe_chain_rewards(task, model, tok, chains, kind, max_new_tokens, samples=4):
    """probe_rewards for K-step chains: the mean chain_reward, greedy and over `samples` sampled
    chains each at T=1 from a fixed seed -> dict(probe_greedy, probe_reward). Leaves the model in
    training mode."""
    def mean_reward(chs, temperature, generator=None):
        steps = imagine_chains(task, chs, text_predictor(model, tok, task, max_new_tokens,
                                                         temperature, generator))
        return sum(chain_reward(task, c, s, kind) for c, s in zip(chs, steps)) / len(chs)
    model.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        greedy = mean_reward(chains, 0.0)
        sampled = mean_reward(chains * samples, 1.0, g)
    model.train()
    return dict(probe_greedy=greedy, probe_reward=sampled)
