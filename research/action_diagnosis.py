"""
Where does the video world model lose the commanded action? The one-step action checks of research/policy_eval.py,
layer by layer, on the same held-out transitions:

    python research/action_diagnosis.py                 # 5 policies x 10 scenes x 15 transitions, ~6 min on 1 core
    python research/action_diagnosis.py --limit=2       # a quick look
Writes results/action_diagnosis/diagnosis.json (--json) and prints one table.

The transitions: the real episodes of policy_eval's one-step checks (the scripted expert with action noise 0, 0.3,
0.6, 1.0 and random actions, --limit held-out scenes each, 16 frames), every frame t with its action -> frame t + 1.
The simulator state of every frame is replayed (data/robot/sim.replay), so the true outcome of any action is known.

Rows, each one layer further from the truth:
  (a) simulator: the true next frames: the detectors' own ceiling;
  (b) tokenizer: each tokenizer's reconstruction of the true next frame (encoded against the context frame, decoded
      with it): can 64 codes show a 3 px gripper move at all?
  (c) GPT: the greedy prediction with the true action (policy_eval.predict_frames), for each shipped world model
      (--temperature=T: one sample at T instead, seeded, for every GPT prediction of the table;
      --guidance=W,...: a row more per model and weight, greedy with the action's contrast, guided_frames).
Columns:
  gripper / push: policy_eval's one-step checks (policy_eval.move_checks): response = the predicted displacement
      projected on the true one, over the true (1: right; 0: no motion or a wrong direction), end-position error in
      px, and whether the check passes (error <= 0.5 x the true displacement);
  (d) counterfactual commands: from every context frame, the same context with each of 8 unit actions (x, y) =
      (cos, sin) of k x 45 degrees (a 3 px move). `cos`: the mean cosine between the gripper displacement the detector
      sees and the commanded direction (a displacement under 0.5 px counts 0: not followed); `along`: the mean
      displacement along the command in px; `distinct`: how many of the 8 next frames differ (1: the action is
      ignored). Row (a) renders what the simulator does (its ceiling: walls and blocks stop some moves), row (b)
      reconstructs those renders, rows (c) are the GPT's greedy predictions;
  (e) the GPT's MLE loss (nats per code) on the next frame's codes given the true action, and the increase when the
      actions are shuffled across the transitions (a derangement), with a paired bootstrap 95% interval over the
      transitions (eval.paired_bootstrap). A model that reads its actions loses more when they are wrong.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
from checkpoint import write_json  # noqa: E402
from data.robot import sim  # noqa: E402
from data.robot.task import Layout, action_bins, frame_codes, still_cells, tokenize_split, windows  # noqa: E402
from model import decode_step, prefill  # noqa: E402
from research.policy_eval import (MOVED_PX, SCENE_STREAM, decode, load_world_model, locate_gripper,  # noqa: E402
                                     move_checks, parse_policy, predict_frames, real_episodes)
from stats import paired_bootstrap  # noqa: E402
from tokenizer_vq import load_vq  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_DIRECTIONS = 8
# the commanded unit actions of the counterfactual check, (8, 2): k x 45 degrees, k = 0 .. 7 (y points down)
DIRECTIONS = np.stack([np.cos(np.arange(N_DIRECTIONS) * 2 * np.pi / N_DIRECTIONS),
                       np.sin(np.arange(N_DIRECTIONS) * 2 * np.pi / N_DIRECTIONS)], 1).astype(np.float32)


# -----------------------------------------------------------------------------
# the transitions and their counterfactual outcomes in the simulator

def transitions(policies, scenes, length, seed):
    """policy_eval's check episodes (scene i of every policy from the stream (seed, 3, i), one sample) and the replayed
    simulator state of every frame but the last -> (episodes, background per transition, state per transition)."""
    eps, backgrounds, states = [], [], []
    for policy in policies:
        for i, ep in enumerate(real_episodes(policy, scenes, 1, length, seed)):
            bg, st = sim.replay(np.random.default_rng([seed, SCENE_STREAM, i]), ep["action"])
            eps.append(ep)
            backgrounds += [bg] * (length - 1)
            states += st[:-1]
    return eps, backgrounds, states


def simulate_commands(backgrounds, states):
    """The true next frame of every transition under each commanded direction -> (N, 8, H, W, 3) uint8."""
    return np.stack([np.stack([sim.render(bg, sim.step(s, a)) for a in DIRECTIONS])
                     for bg, s in zip(backgrounds, states)])


# -----------------------------------------------------------------------------
# what a layer makes of the true frames and of the commands

@torch.no_grad()
def reconstruct(vq, frames, ctx):
    """A tokenizer's reconstruction of frames (N, H, W, 3) uint8 coded against their context frames ctx."""
    codes = torch.cat([vq.tokenize(frames[i:i + 256], ctx[i:i + 256]).cpu() for i in range(0, len(frames), 256)])
    return decode(vq, codes, ctx)


@torch.no_grad()
def guided_frames(wm, ctx, actions, weight, batch_size):
    """Greedy next frames, each code the argmax of log p(code | action) + weight x (log p(code | action) -
    log p(code | no motion)): the same context with the zero action (in the same bins) is decoded beside it, fed
    the same codes. weight 0 is the plain greedy frame; a larger weight moves every code further toward what the
    commanded action changes, so a GPT that knows where a pushed block goes but doubts that it moves puts it there.
    ctx (N, H, W, 3) uint8, actions (N, D) -> (N, H, W, 3) uint8."""
    model, vq, lo, hi, _ = wm
    layout = Layout.of(vq, actions.shape[1])
    ids = [torch.from_numpy(layout.action_tokens(action_bins(a[:, None], lo, hi)))[:, 0]    # (N, D) each
           for a in (actions, np.zeros_like(actions))]
    frames = []
    for s in range(0, len(ctx), batch_size):
        c = vq.tokenize_context(ctx[s:s + batch_size]).cpu()
        runs = [prefill(model, torch.cat([c, a[s:s + batch_size]], 1).tolist(), layout.L, 1) for a in ids]
        logits, codes = [lg for lg, _, _ in runs], []
        for t in range(layout.L):
            act, still = (F.log_softmax(lg.float(), -1) for lg in logits)
            tok = (act + weight * (act - still)).argmax(-1)                              # (B,)
            codes.append(tok)
            if t < layout.L - 1:                         # both prompts continue with the chosen code
                logits = [decode_step(model, tok, lens + t, cache) for _, lens, cache in runs]
        codes = frame_codes(torch.stack(codes, 1).cpu(), layout, 1)[:, 0]                # (B, L)
        frames.append(decode(vq, codes, ctx[s:s + batch_size]))
    return np.concatenate(frames)


def predict_commands(wm, ctx, batch_size, temperature=0.0, generator=None, guidance=0.0):
    """The GPT's next frame (greedy, sampled at temperature, or with guidance > 0 guided_frames's) of every context
    under each commanded direction -> (N, 8, H, W, 3) uint8."""
    acts = np.ascontiguousarray(np.broadcast_to(DIRECTIONS, (len(ctx), N_DIRECTIONS, 2)).reshape(-1, 2))
    ctxs = np.repeat(ctx, N_DIRECTIONS, 0)
    pred = (guided_frames(wm, ctxs, acts, guidance, batch_size) if guidance > 0 else
            predict_frames(wm, ctxs, acts[:, None], temperature, generator, batch_size)[:, 0])
    return pred.reshape(len(ctx), N_DIRECTIONS, *ctx.shape[1:])


def follow(ctx, nxt):
    """Does the gripper follow the commanded directions? ctx (N, H, W, 3) context frames, nxt (N, 8, H, W, 3) the next
    frames under DIRECTIONS. Context frames where the detector finds no gripper are skipped; a next frame without one
    is no motion. -> dict(n contexts, cos, along (px), moved (px), distinct: next frames that differ, of 8)."""
    cos, along, moved, distinct = [], [], [], []
    for c, frames in zip(ctx, nxt):
        p0 = locate_gripper(c)
        if p0 is None:
            continue
        distinct.append(len({f.tobytes() for f in frames}))
        for f, u in zip(frames, DIRECTIONS):
            q = locate_gripper(f)
            d = np.zeros(2, np.float32) if q is None else q - p0
            r = float(np.hypot(*d))
            cos.append(float(d @ u) / r if r > MOVED_PX else 0.0)
            along.append(float(d @ u))
            moved.append(r)
    return dict(n=len(distinct), cos=float(np.mean(cos)), along=float(np.mean(along)), moved=float(np.mean(moved)),
                distinct=float(np.mean(distinct)))


@torch.no_grad()
def code_stats(vq, ctx, nxt):
    """How a tokenizer codes the cells of the next frames nxt that do not change from their context frames ctx
    (data/robot/task.still_cells) -> dict(unchanged: their share of the cells, still_match: the share of them whose
    code is the one the tokenizer gives the cell when nothing changes, vq.tokenize(ctx, ctx); 1 means "unchanged"
    has one code the GPT can copy or learn, less means the GPT must predict codes the decoder ignores)."""
    codes = torch.cat([vq.tokenize(nxt[i:i + 256], ctx[i:i + 256]).cpu() for i in range(0, len(nxt), 256)])
    still = torch.cat([vq.tokenize(ctx[i:i + 256], ctx[i:i + 256]).cpu() for i in range(0, len(ctx), 256)])
    cells = still_cells(nxt, ctx, vq.config.grid)
    return dict(unchanged=float(cells.float().mean()), still_match=float((codes == still)[cells].float().mean()))


@torch.no_grad()
def action_loss(wm, eps, seed, batch_size, still_code=None):
    """The GPT's loss on every transition's next-frame codes (nats per code) with the true action and with the action
    of another transition (a random derangement seeded by `seed`) -> dict(true, shuffled, increase, low, high): the
    means and the paired bootstrap 95% interval of shuffled - true over the transitions; and changed / unchanged:
    the true and shuffled losses on the codes of the cells that change and that do not (data/robot/task.still_cells).
    still_code: the code of unchanged cells a model trained with --still_code=1 was taught (None: the encoder's)."""
    model, vq, lo, hi, _ = wm
    layout = Layout.of(vq, 2)
    tokens = tokenize_split(vq, eps, 1, layout, lo, hi, still_code)
    T = len(eps[0]["image"])
    wins = [(e, t) for e in range(len(eps)) for t in range(T - 1)]
    seq = windows(tokens, layout, [e for e, _ in wins], [t for _, t in wins], 1, 1)     # (N, Lc + D + L)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(seq)))
    shuffled = seq.clone()
    a = slice(layout.Lc, layout.Lc + layout.D)                                          # the action tokens
    shuffled[perm, a] = seq[perm.roll(-1), a]                                       # each takes another's
    code_ce = []                                                                        # (N, L) per code
    for s in (seq, shuffled):
        idx, tgt = layout.training_pair(s, 1)
        out = []
        for i in range(0, len(idx), batch_size):
            logits, _ = model(idx[i:i + batch_size], tgt[i:i + batch_size])
            ce = F.cross_entropy(logits.flatten(0, 1).float(), tgt[i:i + batch_size].flatten(), ignore_index=-1,
                                 reduction="none").view(len(logits), -1)
            out.append(ce[:, -layout.L:])                                               # the next frame's codes
        code_ce.append(torch.cat(out))
    losses = [c.mean(1).numpy() for c in code_ce]
    inc, low, high = paired_bootstrap(losses[1], losses[0])
    ctx = np.concatenate([ep["image"][:-1] for ep in eps])
    cells = still_cells(np.concatenate([ep["image"][1:] for ep in eps]), ctx, vq.config.grid)
    split = {name: dict(true=float(code_ce[0][m].mean()), shuffled=float(code_ce[1][m].mean()))
             for name, m in (("changed", ~cells), ("unchanged", cells))}
    return dict(true=float(losses[0].mean()), shuffled=float(losses[1].mean()), increase=inc, low=low, high=high,
                **split)


# -----------------------------------------------------------------------------
# the table

def diagnose(tokenizers, models, eps, backgrounds, states, batch_size, seed, log=print, temperature=0.0,
             guidance=()):
    """tokenizers: name -> tokenizer; models: name -> (policy_eval.WorldModel, the still code it was
    trained with or None); temperature: 0 greedy GPT predictions, else one sample each (seeded); guidance: weights
    of guided_frames, a row more per model and weight ("<name>, guided W": its checks and counterfactual). -> rows:
    name -> dict(layer, checks (policy_eval.move_checks), counterfactual (follow), codes (code_stats; tokenizer
    rows), loss (action_loss; GPT rows but the guided ones: decoding leaves the loss as it is))."""
    ctx = np.concatenate([ep["image"][:-1] for ep in eps])
    nxt = np.concatenate([ep["image"][1:] for ep in eps])
    acts = np.concatenate([ep["action"][:-1] for ep in eps])                       # (N, D) the true actions
    t0 = time.time()
    commanded = simulate_commands(backgrounds, states)                           # (N, 8, H, W, 3)
    rows = {"simulator": dict(layer="a", checks=move_checks(eps, nxt), counterfactual=follow(ctx, commanded))}
    log(f"(a) simulator ({time.time() - t0:.0f}s)")
    for name, vq in tokenizers.items():
        t0 = time.time()
        cf = reconstruct(vq, commanded.reshape(-1, *ctx.shape[1:]), np.repeat(ctx, N_DIRECTIONS, 0))
        rows[name] = dict(layer="b", checks=move_checks(eps, reconstruct(vq, nxt, ctx)),
                          counterfactual=follow(ctx, cf.reshape(commanded.shape)), codes=code_stats(vq, ctx, nxt))
        log(f"(b) {name} ({time.time() - t0:.0f}s)")
    for name, (wm, still_code) in models.items():
        t0 = time.time()
        gen = torch.Generator().manual_seed(seed)                  # each model samples the same stream
        pred = predict_frames(wm, ctx, acts[:, None], temperature, gen, batch_size)[:, 0]
        rows[name] = dict(layer="c", checks=move_checks(eps, pred),
                          counterfactual=follow(ctx, predict_commands(wm, ctx, batch_size, temperature, gen)),
                          loss=action_loss(wm, eps, seed, batch_size, still_code))
        log(f"(c) {name} ({time.time() - t0:.0f}s)")
        for w in guidance:
            t0 = time.time()
            pred = guided_frames(wm, ctx, acts, w, batch_size)
            rows[f"{name}, guided {w:g}"] = dict(
                layer="c", checks=move_checks(eps, pred),
                counterfactual=follow(ctx, predict_commands(wm, ctx, batch_size, guidance=w)))
            log(f"(c) {name}, guided {w:g} ({time.time() - t0:.0f}s)")
    return rows


def print_table(rows, file=None):
    print(f"{'layer':<34}{'gripper resp/err px':>21}{'push resp/err px':>18}{'(d) cos':>9}{'along px':>9}"
          f"{'distinct':>9}{'still':>7}{'(e) loss':>9}{'shuffled - true [95% CI]':>30}{'changed cells':>18}",
          file=file)
    for name, r in rows.items():
        g, p, cf = r["checks"]["gripper"], r["checks"]["push"], r["counterfactual"]
        still = f"{r['codes']['still_match']:>7.2f}" if "codes" in r else f"{'':>7}"
        loss = r.get("loss")
        e = ("" if loss is None else f"{loss['true']:>9.3f}"
             f"{loss['increase']:>+12.4f} [{loss['low']:+.4f}, {loss['high']:+.4f}]"
             f"{loss['changed']['true']:>10.3f} -> {loss['changed']['shuffled']:.3f}")
        mark = {True: " ", False: "x"}
        print(f"({r['layer']}) {name:<30}{g['response']:>11.2f} / {g['error_px']:4.2f}{mark[g['passed']]}"
              f"{p['response']:>9.2f} / {p['error_px']:4.2f}{mark[p['passed']]}{cf['cos']:>9.2f}{cf['along']:>9.2f}"
              f"{cf['distinct']:>9.2f}{still}{e}", file=file)
    first = next(iter(rows.values()))["checks"]
    print(f"x: check failed (end error > 0.5 x the true move); {first['gripper']['n']} gripper moves of "
          f"{first['gripper']['true_px']:.2f} px and {first['push']['n']} pushes of {first['push']['true_px']:.2f} px "
          f"on average; (d): {next(iter(rows.values()))['counterfactual']['n']} contexts x {N_DIRECTIONS} commands; "
          f"still: the share of unchanged cells coded as 'nothing changed'; changed cells: (e)'s loss on the codes of "
          f"the cells that change, true -> shuffled actions", file=file)


def add_transition_args(p):
    """The flags that pick the held-out transitions and how to run over them (research/push_order.py has them
    too)."""
    p.add_argument("--policies", default="0,0.3,0.6,1.0,random", help="expert action-noise stds and/or 'random'")
    p.add_argument("--limit", type=int, default=10, help="held-out scenes per policy (policy_eval's check_episodes)")
    p.add_argument("--length", type=int, default=16, help="frames per episode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)


def transition_policies(args):
    """The policies of add_transition_args's flags, checked -> list (ValueError naming the flag)."""
    policies = [parse_policy(x.strip()) for x in args.policies.split(",") if x.strip()]
    if not policies or args.limit < 1 or args.length < 2:
        raise ValueError("need --policies, --limit >= 1 and --length >= 2")
    return policies


def main(argv=None):
    p = argparse.ArgumentParser(description="the one-step action checks layer by layer: simulator, tokenizer, GPT",
                                allow_abbrev=False)
    ck = ROOT / "checkpoints"
    p.add_argument("--tokenizers", nargs="*", default=[str(ck / "video_cvq.safetensors"),
                                                        str(ck / "video_vq.safetensors")])
    p.add_argument("--models", nargs="*", default=[str(ck / f"{n}.safetensors") for n in
                                                    ("video_cond_mle", "video_mle", "video_mle_4000")],
                   help="world models of train_video.py (each with the tokenizer its metadata names; "
                        "default: the shipped ones)")
    p.add_argument("--copy_gate", type=int, default=-1, choices=[-1, 0, 1],
                   help="-1: decode as each checkpoint records; 1: every tokenizer and model with the copy gate "
                        "(tokenizer_vq.VQVAE.detokenize; e.g. a per-frame MLE model, the start of a --copy_gate=1 "
                        "run); 0: without")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: the GPTs' greedy predictions (policy_eval's checks); T > 0: one sample at T each")
    p.add_argument("--guidance", default="",
                   help="comma-separated weights W > 0: per model a row more for each, greedy with log p(a) + "
                        "W x (log p(a) - log p(no motion)) (guided_frames); needs --temperature=0")
    add_transition_args(p)
    p.add_argument("--json", default=str(ROOT / "results" / "action_diagnosis" / "diagnosis.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        policies = transition_policies(args)
        if args.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
        try:
            guidance = [float(w) for w in args.guidance.split(",") if w.strip()]
        except ValueError:
            raise ValueError(f"--guidance: not comma-separated numbers: {args.guidance!r}") from None
        if any(w <= 0 for w in guidance) or (guidance and args.temperature > 0):
            raise ValueError(f"--guidance: weights must be > 0, with --temperature=0 (got {args.guidance!r})")
        for path in args.tokenizers:
            if not Path(path).is_file():
                raise ValueError(f"{path}: no such checkpoint")
        tokenizers = {f"tokenizer {Path(t).stem}": load_vq(t)[0].eval() for t in args.tokenizers}
        models = {}
        for path in args.models:
            wm, a = load_world_model(path)
            # a model of train_video.py --still_code=N learnt code N for every unchanged cell
            still = a.get("still_code", -1)
            folder = Path(path).resolve().parent
            name = Path(path).stem if folder == ck.resolve() else f"{folder.name}/{Path(path).stem}"
            models[f"GPT {name}"] = (wm, None if still == -1 else still)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if args.copy_gate >= 0:   # the copy gate forced on or off, for every tokenizer (per-frame ones have one)
        for vq in [*tokenizers.values(), *(wm.vq for wm, _ in models.values())]:
            vq.copy_gate = bool(args.copy_gate)
    t0 = time.time()
    eps, backgrounds, states = transitions(policies, args.limit, args.length, args.seed)
    rows = diagnose(tokenizers, models, eps, backgrounds, states, args.batch_size, args.seed,
                    temperature=args.temperature, guidance=guidance)
    print(f"\n{len(eps)} held-out episodes ({args.limit} scenes x {len(policies)} policies), "
          f"{len(backgrounds)} transitions ({(time.time() - t0) / 60:.1f} min)")
    print_table(rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, dict(rows=rows, directions=DIRECTIONS.tolist(), policies=args.policies,
                                   scenes=args.limit, length=args.length, seed=args.seed, copy_gate=args.copy_gate,
                                   temperature=args.temperature, guidance=guidance,
                                   checkpoints=dict(tokenizers=args.tokenizers, models=args.models)))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
