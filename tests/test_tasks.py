"""tasks.py and eval.py: the registry, cropping, RLVR's prompt pool (train_lang.py's PromptPool) and probe,
aggregation, the no-change baseline, evaluation of checkpoints and the printed tables."""
from pathlib import Path

import pytest

from data.lights.task import generate_split as lights_split
from data.textgame.simulator import generate_split as textgame_split
from data.webpage.simulator import generate_split as webpage_split
from eval import print_comparison, print_table, summarize
from stats import paired_diffs, print_diffs
from tasks import TASKS, Task, from_module


def test_summarize_splits_changed_and_unchanged():
    per = [{"accuracy": 1.0}, {"accuracy": 0.0}, {"accuracy": 1.0}, {"accuracy": 1.0}]
    s = summarize(per, [True, True, False, False])
    assert s == {"accuracy": 0.75, "accuracy_changed": 0.5, "accuracy_unchanged": 1.0}
    assert summarize(per, [True] * 4)["accuracy_unchanged"] is None


@pytest.mark.parametrize("task,split", [("textgame", textgame_split), ("webpage", webpage_split),
                                        ("lights", lights_split)])
def test_no_change_answer_is_right_exactly_on_unchanged_records(task, split):
    T = TASKS[task]
    records = split("val", 60, 0)
    for r in records:
        m = T.score(T.no_change, r)[T.headline]
        assert (m == 1.0) == (not T.data.is_changed(r)), r["action"]
        assert T.score(T.data.target_text(r), r)[T.headline] == 1.0  # the truth scores the maximum


def test_a_one_module_task_registers_with_one_line():
    """from_module: the module is the task's data and split generator, its names the other fields."""
    import data.lights.task as lights
    T = from_module(lights)
    assert isinstance(T, Task) and T == TASKS["lights"]
    assert T.data is T.prepare is lights and T.score is lights.score and T.reward is lights.reward
    assert (T.headline, T.rewards, T.no_change) == ("exact", ("exact", "f1"), "none")
    assert sorted(TASKS) == ["lights", "textgame", "webpage"]   # train_lang.py's --task choices


def test_print_table_has_baseline_row(capsys):
    row = {"accuracy": 0.5, "accuracy_changed": 0.25, "accuracy_unchanged": 1.0,
           "sampled": {"accuracy": 0.4}, "baseline_no_change": {"accuracy": 0.45, "accuracy_changed": 0.0,
                                                                "accuracy_unchanged": 1.0}}
    print_table("textgame", {"mle": row})
    out = capsys.readouterr().out
    assert "always-no-change baseline" in out and " 50.00" in out and " 45.00" in out


def test_prompts_longer_than_the_block_are_cropped_not_fatal():
    import torch
    from tasks import crop, generate_texts
    from model import GPT, GPTConfig
    from tokenizer_text import Tokenizer
    assert crop([[1, 2, 3, 4, 5], [1, 2]], 6, 200) == ([[3, 4, 5], [1, 2]], 1)  # room min(200, 64, 6 // 2) = 3
    tok = Tokenizer.train([" ".join(f"w{i % 97} x{i % 13}" for i in range(3000))], 300)
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=32, n_layer=1, n_head=2, n_embd=16))
    prompts = [tok.encode("abc def " * 40), tok.encode("abc")]      # the first is longer than the block
    assert len(prompts[0]) > 32
    out = generate_texts(model, tok, prompts, max_new_tokens=8, batch_size=2)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)


def test_paired_diffs_and_print_use_the_changed_subset(capsys):
    changed = [True, True, False, False]
    rows = {"mle": {"per_record": {"accuracy": [0.0, 0.0, 1.0, 1.0], "changed": changed}},
            "rlvr": {"per_record": {"accuracy": [1.0, 1.0, 1.0, 0.0], "changed": changed}}}
    table = paired_diffs(rows, [("rlvr", "mle")], ["accuracy"])
    (a1, b1, _, s1, m1, _, _), (_, _, _, s2, m2, lo2, hi2) = table
    assert (a1, b1, s1, m1) == ("rlvr", "mle", "all", 0.25)
    assert (s2, m2, lo2, hi2) == ("changed", 1.0, 1.0, 1.0)
    print_diffs("paired differences", table, points=True)
    out = capsys.readouterr().out
    assert "rlvr - mle" in out and "+25.00" in out and "+100.00" in out


def test_print_comparison_pairs_every_model_with_the_start_then_the_control(capsys):
    changed = [True, False]

    def row(acc):   # an evaluate result of two records
        per = [{"accuracy": a} for a in acc]
        return dict(summarize(per, changed), n=2, n_changed=1, per_record={"accuracy": acc, "changed": changed},
                    baseline_no_change=summarize([{"accuracy": 0.0}, {"accuracy": 1.0}], changed))

    print_comparison("textgame", "test", {"mle": row([0.0, 1.0]), "rlvr": row([1.0, 1.0]), "mle_more": row([0.0, 0.0])})
    out = capsys.readouterr().out
    assert "test split (2 transitions, 1 changed), accuracy % (greedy):" in out and "always-no-change" in out
    assert [tuple(line.split()[0:5:2]) for line in out.splitlines() if " - " in line] == [
        ("rlvr", "mle", "all"), ("rlvr", "mle", "changed"), ("mle_more", "mle", "all"), ("mle_more", "mle", "changed"),
        ("rlvr", "mle_more", "all"), ("rlvr", "mle_more", "changed")]


def test_keep_tokenizer_copies_ours_and_points_at_an_hf_directory(tmp_path):
    from tasks import keep_tokenizer
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "tokenizer.tiktoken").write_text("ranks")
    init = tmp_path / "run1" / "mle.safetensors"          # our checkpoint names its tokenizer relative to its folder
    out = tmp_path / "run2"
    assert keep_tokenizer(init, {"args": {"tokenizer": "tokenizer.tiktoken"}}, out, write=False) == "tokenizer.tiktoken"
    assert not (out / "tokenizer.tiktoken").exists()      # not rank 0: nothing written
    assert keep_tokenizer(init, {"args": {"tokenizer": "tokenizer.tiktoken"}}, out) == "tokenizer.tiktoken"
    assert (out / "tokenizer.tiktoken").read_text() == "ranks"   # out_dir is self-contained
    hf = tmp_path / "hf"
    hf.mkdir()
    assert keep_tokenizer(hf, {"args": {"tokenizer": str(hf)}}, out) == str(hf.resolve())   # HF: stays in place


def test_probe_rewards_is_the_mean_task_reward_greedy_and_sampled():
    import torch
    from tasks import generate_texts, probe_rewards
    from model import GPT, GPTConfig
    from tokenizer_text import Tokenizer
    records = textgame_split("val", 6, 0)
    T = TASKS["textgame"]
    tok = Tokenizer.train([T.data.prompt_text(r) + T.data.target_text(r) for r in records], 300)
    torch.manual_seed(0)
    model = GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=1024, n_layer=1, n_head=2, n_embd=16))
    prompts = [tok.encode(T.data.prompt_text(r)) for r in records]
    p = probe_rewards("textgame", model, tok, prompts, records, "task_specific", 16, samples=2)
    assert model.training                                 # left in training mode
    greedy = generate_texts(model, tok, prompts, 16)      # the same greedy answers, scored by the training reward
    assert p["probe_greedy"] == sum(T.reward(t, r, "task_specific") for t, r in zip(greedy, records)) / 6
    assert p == probe_rewards("textgame", model, tok, prompts, records, "task_specific", 16, samples=2)  # fixed seed


def test_prompt_pool_fits_the_room_and_draws_the_unchanged_share():
    import torch
    from tasks import PromptPool
    from tokenizer_text import Tokenizer
    records = textgame_split("train", 60, 0)
    T = TASKS["textgame"]
    tok = Tokenizer.train([T.data.prompt_text(r) + T.data.target_text(r) for r in records], 300)
    lengths = sorted(len(tok.encode(T.data.prompt_text(r))) for r in records)
    room = lengths[len(lengths) // 2]                     # about half the prompts fit
    def pool_of(recs):
        return PromptPool(recs, T.data.prompt_text, T.data.is_changed, tok, room, 0.25,
                          torch.Generator().manual_seed(0))
    pool = pool_of(records)
    fits = [r for r in records if len(tok.encode(T.data.prompt_text(r))) <= room]
    assert [r for r, _ in pool.changed] == [r for r in fits if T.data.is_changed(r)]
    assert [r for r, _ in pool.unchanged] == [r for r in fits if not T.data.is_changed(r)]
    prompts, recs = pool(8)
    assert [T.data.is_changed(r) for r in recs] == [True] * 6 + [False] * 2   # round(8 * 0.25) unchanged, last
    assert prompts == [tok.encode(T.data.prompt_text(r)) for r in recs]
    again = pool_of(records)(8)
    assert again == (prompts, recs)                       # the generator alone decides the draw
    only_changed = pool_of([r for r in fits if T.data.is_changed(r)])
    assert all(T.data.is_changed(r) for r in only_changed(8)[1])   # no unchanged records: all 8 changed


def test_evaluate_checkpoints_pairs_every_model_on_every_split(tmp_path):
    import torch
    from checkpoint import save_checkpoint
    from eval import evaluate, evaluate_checkpoints
    from tasks import load_lang_model
    from model import GPT, GPTConfig
    from tokenizer_text import Tokenizer
    records = textgame_split("val", 4, 0)
    T = TASKS["textgame"]
    tok = Tokenizer.train([T.data.prompt_text(r) + T.data.target_text(r) for r in records], 300)
    tok.save(tmp_path / "tokenizer.tiktoken")
    ckpts = {}
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        model = GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=1024, n_layer=1, n_head=2, n_embd=16))
        ckpts[name] = str(tmp_path / f"{name}.safetensors")
        save_checkpoint(ckpts[name], model, args={"tokenizer": "tokenizer.tiktoken"})
    splits = {"val": records[:2], "test": records[2:]}
    res = evaluate_checkpoints("textgame", ckpts, tok, splits, 8)
    assert list(res) == ["val", "test"] and all(list(r) == ["a", "b"] for r in res.values())
    direct = evaluate("textgame", load_lang_model(ckpts["b"])[0], tok, records[2:], 8, desc=None)
    assert res["test"]["b"] == direct                     # each model from its checkpoint, as evaluate scores it


def test_evaluate_checkpoints_in_two_processes_equals_one(tmp_path):
    """The final evaluation split over forked workers gives the same per-record results as one process."""
    from eval import evaluate_checkpoints
    from tasks import load_lang_model
    ckpt = Path(__file__).resolve().parents[1] / "checkpoints" / "textgame" / "mle.safetensors"
    tok = load_lang_model(ckpt)[1]
    records = textgame_split("val", 12, 0)
    splits = {"val": records[:4], "test": records[4:]}
    ckpts = {"mle": str(ckpt), "again": str(ckpt)}
    one = evaluate_checkpoints("textgame", ckpts, tok, splits, 200)
    two = evaluate_checkpoints("textgame", ckpts, tok, splits, 200, workers=2)
    assert one == two and list(two) == ["val", "test"] and list(two["test"]) == ["mle", "again"]
    assert 0 < one["test"]["mle"]["accuracy"]   # a trained model: the comparison is not between empty answers
