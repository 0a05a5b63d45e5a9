"""eval.py's aggregation and its baselines, without any model."""
import pytest

from data.textgame.simulator import generate_split as textgame_split
from data.webpage.simulator import generate_split as webpage_split
from eval import TASKS, print_table, summarize


def test_summarize_splits_changed_and_unchanged():
    per = [{"accuracy": 1.0}, {"accuracy": 0.0}, {"accuracy": 1.0}, {"accuracy": 1.0}]
    s = summarize(per, [True, True, False, False])
    assert s == {"accuracy": 0.75, "accuracy_changed": 0.5, "accuracy_unchanged": 1.0}
    assert summarize(per, [True] * 4)["accuracy_unchanged"] is None


@pytest.mark.parametrize("task,split", [("textgame", textgame_split), ("webpage", webpage_split)])
def test_no_change_answer_is_right_exactly_on_unchanged_records(task, split):
    T = TASKS[task]
    records = split("val", 60, 0)
    for r in records:
        m = T.metrics(T.no_change, r)[T.headline]
        assert (m == 1.0) == (not T.data.is_changed(r)), r["action"]
        assert T.metrics(T.data.target_text(r), r)[T.headline] == 1.0  # the truth scores the maximum


def test_print_table_has_baseline_row(capsys):
    row = {"accuracy": 0.5, "accuracy_changed": 0.25, "accuracy_unchanged": 1.0,
           "sampled": {"accuracy": 0.4}, "baseline_no_change": {"accuracy": 0.45, "accuracy_changed": 0.0,
                                                                "accuracy_unchanged": 1.0}}
    print_table("textgame", {"mle": row})
    out = capsys.readouterr().out
    assert "always-no-change baseline" in out and " 50.00" in out and " 45.00" in out


def test_prompts_longer_than_the_block_are_cropped_not_fatal():
    import torch
    from eval import crop, generate_texts
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
