import re
from pathlib import Path

import numpy as np
import pytest
import torch

from data.robot import sim
from data.robot.task import Layout, frame_codes, rollout
from stats import paired_diffs
from model import GPT, GPTConfig
from tokenizer_vq import VQConfig, VQVAE
from video_eval import EvalSpec, eval_video, evaluate_video_models, load_video_model, print_video_report, write_grid
from video_rewards import mae


def tiny(n_codes=16, D=2):
    torch.manual_seed(0)
    vq = VQVAE(VQConfig(channels=(4, 4, 8), n_codes=n_codes)).eval()
    lay = Layout(n_codes, 64, D)
    gpt = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=4 * lay.frame_len, n_layer=1, n_head=2, n_embd=16))
    return vq, lay, gpt


def test_rollout_injects_actions_between_sampled_frames():
    vq, lay, gpt = tiny()
    prompts = [list(range(66)), list(range(1, 67))]
    actions = torch.tensor([[[16, 16 + 256 + 5], [17, 16 + 256 + 6]]] * 2)        # (N, horizon - 1, D)
    tok, lp, sampled = rollout(gpt, prompts, actions, 3, 64, 1.0, torch.Generator().manual_seed(0))
    assert tok.shape == lp.shape == sampled.shape == (2, 3 * 64 + 2 * 2)
    assert tok[:, 64:66].tolist() == actions[:, 0].tolist() and tok[:, 130:132].tolist() == actions[:, 1].tolist()
    assert not sampled[:, 64:66].any() and sampled[:, :64].all() and (lp[:, 64:66] == 0).all()
    assert (lp[sampled] < 0).all()
    codes = frame_codes(tok, lay, 3)
    assert codes.shape == (2, 3, 64) and codes.max() < lay.K
    bad = tok.clone()
    bad[0, 0] = lay.K + 3                                                   # an action token where a code belongs
    assert frame_codes(bad, lay, 3)[0, 0, 0] == 0


def test_eval_video_reports_baselines_and_checks(tmp_path):
    vq, lay, gpt = tiny()
    rng = np.random.default_rng(0)
    eps = []
    for _ in range(2):
        ep = sim.episode(rng, 5, 0.0)
        eps.append(dict(image=ep["image"], action=ep["action"], background=ep["background"]))
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    res = eval_video(gpt, vq, eps, None, EvalSpec(lo, hi, 1, 2), desc=None, grid_path=tmp_path / "g.gif")
    assert res["n_windows"] == 4 and res["n"] == 8 and res["lpips"] is None
    for k in ("mse", "mae", "psnr", "ssim", "mae_moving", "repetition_rate"):
        assert np.isfinite(res[k])
    # the copy baseline is exactly the last context frame against the truth
    t = torch.from_numpy(eps[0]["image"]).permute(0, 3, 1, 2).float() / 255
    copy = torch.cat([mae(t[0:1].expand(2, -1, -1, -1), t[1:3]), mae(t[2:3].expand(2, -1, -1, -1), t[3:5])])
    t = torch.from_numpy(eps[1]["image"]).permute(0, 3, 1, 2).float() / 255
    copy = torch.cat([copy, mae(t[0:1].expand(2, -1, -1, -1), t[1:3]), mae(t[2:3].expand(2, -1, -1, -1), t[3:5])])
    assert abs(res["copy_last_frame"]["mae"] - copy.mean().item()) < 1e-6
    assert 0 < res["objects"]["pixels_truth"] < 0.3 and 0 <= res["objects"]["recall"] <= 1
    assert (tmp_path / "g.gif").is_file()


def test_per_record_values_and_paired_differences(capsys):
    vq, lay, gpt = tiny()
    rng = np.random.default_rng(1)
    eps = [dict(sim.episode(rng, 5, 0.0)) for _ in range(2)]
    lo, hi = np.full(2, -1, np.float32), np.ones(2, np.float32)
    res = eval_video(gpt, vq, eps, None, EvalSpec(lo, hi, 1, 2), desc=None)
    pr = res["per_record"]
    assert pr["windows"] == [[0, 0], [0, 2], [1, 0], [1, 2]]                     # fixed order: clip, first frame
    assert all(len(pr[k]) == 4 for k in ("mae", "ssim", "repetition", "changed"))
    # every window has 2 frames, so the per-window means average to the summary
    assert abs(np.mean(pr["mae"]) - res["mae"]) < 1e-6 and abs(np.mean(pr["ssim"]) - res["ssim"]) < 1e-6
    assert abs(np.mean(res["copy_last_frame"]["per_record"]["mae"]) - res["copy_last_frame"]["mae"]) < 1e-6
    # top-k 1 sampling is greedy decoding: the same predictions, whatever the temperature
    topk1 = eval_video(gpt, vq, eps, None, EvalSpec(lo, hi, 1, 2, temperature=1.0, top_k=1, seed=3), desc=None)
    assert topk1["per_record"]["mae"] == pr["mae"] and topk1["top_k"] == 1
    sampled = eval_video(gpt, vq, eps, None, EvalSpec(lo, hi, 1, 2, temperature=1.0, seed=3), desc=None)
    assert sampled["per_record"]["mae"] != pr["mae"]                              # an untrained GPT samples noise
    # paired differences: a model 0.01 worse on every window, against itself and against copying
    worse = dict(res, per_record=dict(pr, mae=[x + 0.01 for x in pr["mae"]]))
    copy = {"per_record": dict(res["copy_last_frame"]["per_record"], changed=pr["changed"])}
    diffs = {(a, b, m, sub): (mean, lo_, hi_) for a, b, m, sub, mean, lo_, hi_ in
             paired_diffs({"m": res, "worse": worse, "copy": copy}, [("worse", "m"), ("m", "copy")],
                          ("mae", "ssim"))}
    mean, lo_, hi_ = diffs[("worse", "m", "mae", "all")]
    assert abs(mean - 0.01) < 1e-9 and abs(lo_ - 0.01) < 1e-9 and abs(hi_ - 0.01) < 1e-9
    assert diffs[("worse", "m", "ssim", "all")][0] == 0
    copy_gap = np.mean(pr["mae"]) - np.mean(res["copy_last_frame"]["per_record"]["mae"])
    assert abs(diffs[("m", "copy", "mae", "all")][0] - copy_gap) < 1e-9
    # the "changed" rows (windows whose truth moves) only when some window is static (else they
    # repeat "all")
    assert (("worse", "m", "mae", "changed") in diffs) == (not all(pr["changed"]))
    static = dict(res, per_record=dict(pr, changed=[True, False, True, True]))
    subs = {d[3] for d in paired_diffs({"m": static, "worse": worse}, [("worse", "m")], ["mae"])}
    assert subs == {"all", "changed"}
    short = dict(res, per_record=dict(pr, mae=pr["mae"][:3]))
    with pytest.raises(ValueError, match="different records"):
        paired_diffs({"m": res, "short": short}, [("short", "m")], ["mae"])
    # the report: the table with each model's sampled row, every pair greedy, the models' pairs
    # sampled (copying does not sample)
    print_video_report({"m": dict(res, sampled=sampled), "worse": dict(worse, sampled=sampled)},
                       [("worse", "m"), ("m", "copy")])
    out = capsys.readouterr().out
    assert "m T=1 top-k 100" in out and "copy-last-frame" in out and "tokenizer ceiling" in out
    greedy, sampled_part = out.split("sampled at T=1 top-k 100:")
    assert re.search(r"worse - m +mae +all +\+0\.01000  \[\+0\.01000, \+0\.01000\]  \*", greedy)
    assert "m - copy" in greedy and "worse - m" in sampled_part and "m - copy" not in sampled_part


def test_evaluate_video_models_greedy_and_the_papers_protocol_forked_or_not(tmp_path):
    """Each model greedy (with its grid) and, with official, sampled at T=1 top-k 100 from the spec's seed under
    "sampled" (no grid): the same results in one process as in two forked ones."""
    vq, lay, gpt = tiny()
    rng = np.random.default_rng(2)
    eps = [dict(sim.episode(rng, 5, 0.0)) for _ in range(2)]
    spec = EvalSpec(np.full(2, -1, np.float32), np.ones(2, np.float32), 1, 2, seed=5)
    torch.manual_seed(1)   # another model: its own results under its own name
    other = GPT(GPTConfig.llama(vocab_size=lay.vocab_size, block_size=4 * lay.frame_len, n_layer=1, n_head=2,
                                n_embd=16))
    models = {"a": (gpt, vq, eps, None, spec, tmp_path / "a.gif"), "b": (other, vq, eps, None, spec, None)}
    one = evaluate_video_models(models, None, True)
    assert set(one) == {"a", "b"} and one["a"]["top_k"] is None and one["a"]["sampled"]["top_k"] == 100
    sampled_b = eval_video(other, vq, eps, None, EvalSpec(spec.lo, spec.hi, 1, 2, 1.0, 100, 5), desc=None)
    assert one["b"]["sampled"] == sampled_b and sampled_b["per_record"] != one["a"]["sampled"]["per_record"]
    official = eval_video(gpt, vq, eps, None, EvalSpec(spec.lo, spec.hi, 1, 2, 1.0, 100, 5), desc=None)
    greedy = eval_video(gpt, vq, eps, None, spec, desc=None)
    assert one["a"]["sampled"] == official and one["a"] == dict(greedy, sampled=official)
    assert (tmp_path / "a.gif").is_file() and len(list(tmp_path.iterdir())) == 1
    assert evaluate_video_models(models, None, True, workers=2) == one
    assert "sampled" not in evaluate_video_models(models, None, False)["b"]


def test_write_grid_png(tmp_path):
    rows = [(torch.rand(3, 8, 8), torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8))] * 2
    write_grid(rows, tmp_path / "g.png")
    import imageio.v2 as imageio
    assert imageio.imread(tmp_path / "g.png").shape == (2 * 8 * 2, 4 * 8 * 2, 3)


def test_grpo_with_the_multi_step_sampler_keeps_injected_actions_out_of_the_loss():
    from grpo import Env, GRPOConfig, grpo_step, rollout as grpo_rollout
    vq, lay, gpt = tiny()
    K, L, D = 2, 64, 2
    cfg = GRPOConfig(group_size=2, max_new_tokens=K * L + D, beta=0.0, micro_batch=4)
    acts = torch.tensor([[lay.K + 7, lay.K + 256 + 9]])
    items = [dict(actions=acts), dict(actions=acts)]
    prompts = [list(range(66)), list(range(2, 68))]

    def sampler(m, ps, its, c, gen):
        return rollout(m, ps, torch.stack([it["actions"] for it in its]), K, L, c.temperature, gen)

    def reward_fn(its, completions):
        return [sum(t == 3 for t in c) / len(c) for c in completions]

    g = torch.Generator().manual_seed(0)
    batch = grpo_rollout(gpt, prompts, items, Env(reward_fn, sampler=sampler), cfg, g)
    start = 0  # the batch holds the completions only; each prompt is stored once (batch["prompt_idx"])
    assert batch["mask"][:, start:start + L].all() and not batch["mask"][:, start + L:start + L + D].any()
    assert batch["mask"][:, start + L + D:start + 2 * L + D].all() and batch["mask"].sum() == 4 * K * L
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-3)
    stats = grpo_step(gpt, None, opt, prompts, items, Env(reward_fn, sampler=sampler), cfg, g, 0)
    assert np.isfinite(stats["loss"]) and stats["response_len"] == K * L + D


def test_copy_gate_forced_for_every_model_or_as_trained():
    # load_video_model(copy_gate=): 1 / 0 for every model; -1 as each checkpoint was trained
    ck = Path(__file__).resolve().parents[1] / "checkpoints"
    names = ("video_mle_4000.safetensors", "video_mle.safetensors")
    trained = {p: load_video_model(ck / p)[2]["args"].get("copy_gate", 0) for p in names}
    assert {p: load_video_model(ck / p, copy_gate=-1)[1].copy_gate for p in names} == \
        {p: bool(g) for p, g in trained.items()}
    for gate in (1, 0):
        assert all(load_video_model(ck / p, copy_gate=gate)[1].copy_gate is bool(gate) for p in names)
