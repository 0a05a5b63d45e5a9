"""The paper's own prompt, chat template, answer format and recipe (issue 46, part 2).

tests/official_textgame.json holds 3 records of GPT-simulator's test set with the sha256 of the
prompt that RLVR-World's own data pipeline (process_jsonl.py, run once outside the repository)
built for each; the same check passed on all 2,954 records of that test set when it was made."""
import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.textgame.prepare import convert_record, official_prompt
from data.textgame.task import make_diff, prompt_text
from grpo import PAPER_RECIPE, Env, GRPOConfig, grpo_step, k3_kl
from rewards import textgame_reward
from tasks import load_lang_model, reward_fn

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests" / "official_textgame.json").read_text())
# DeepSeek-R1-Distill-Qwen-1.5B's tokenizer_config.json "chat_template" (the paper's base model)
R1_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
    "{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}"
    "{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}")
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]


def records():
    return [convert_record(r["raw"]) | {"prompt": official_prompt(r["raw"], FIXTURE["official"])}
            for r in FIXTURE["records"]]


def official_answer(record, diff=None):
    """An answer in the SFT models' format: a think block, then the cue the prompt asks for and
    the diff printed as Python prints a dict (as the prompt's worked examples are)."""
    diff = make_diff(record["state"], record["next_state"]) if diff is None else diff
    return f"<think>\nThe action changes ...\n</think>\n\nThe final answer is: {diff}"


def test_prompts_equal_the_official_pipeline():
    for rec, want in zip(records(), FIXTURE["records"]):
        got = prompt_text(rec)
        assert got.endswith(want["prompt_tail"])
        assert hashlib.sha256(got.encode()).hexdigest() == want["prompt_sha256"]


def test_prepare_writes_the_prompt(tmp_path):
    sim = tmp_path / "sim"   # a GPT-simulator checkout's files, from the fixture
    official = FIXTURE["official"]
    for kind in ("object", "action", "score"):
        path = sim / "rules" / "human_written_rules" / f"{kind}_rules.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(official["rules"][kind]))
    (sim / "experiments").mkdir()
    (sim / "experiments" / "games.json").write_text(json.dumps({"example": "dishwasher"}))
    (sim / "data").mkdir()
    (sim / "data" / "examples.json").write_text(json.dumps({"full": official["examples"]}))
    tick = {"action_change": [], "time_change": [1] if official["tick_example"] else []}
    (sim / "data" / "dynamic_states.json").write_text(json.dumps({"dishwasher": tick}))
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r["raw"]) + "\n" for r in FIXTURE["records"]))
    subprocess.run([sys.executable, "data/textgame/prepare.py", f"--bytesized32={src}",
                    f"--out={tmp_path / 'out.jsonl'}", f"--gpt_simulator={sim}"], cwd=ROOT,
                   check=True, capture_output=True)
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [hashlib.sha256(r["prompt"].encode()).hexdigest() for r in out] == \
        [r["prompt_sha256"] for r in FIXTURE["records"]]


def test_the_reward_reads_official_answers():
    for rec, raw in zip(records(), FIXTURE["records"]):
        assert textgame_reward(official_answer(rec), rec["state"], rec["next_state"]) == 1.0
        if "answer" in raw:   # GPT-simulator's own diff, as its worked examples print it
            text = "<think>\n...\n</think>\n\nThe final answer is: " + raw["answer"]
            assert textgame_reward(text, rec["state"], rec["next_state"]) == 1.0
        # a wrong score, or a final answer missing "removed" (the think block's draft is not read)
        diff = make_diff(rec["state"], rec["next_state"])
        wrong = dict(diff, score={"score": -7, "gameOver": False, "gameWon": False})
        assert textgame_reward(official_answer(rec, wrong), rec["state"], rec["next_state"]) == 0
        draft = official_answer(rec).replace("</think>", f"{diff}</think>")
        cut = draft.split("The final answer is:")[0] + "The final answer is: {'modified': []}"
        assert textgame_reward(cut, rec["state"], rec["next_state"]) == 0


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny HF directory in the paper's format: a byte-level BPE tokenizer with R1-Distill's
    special tokens and chat template, and a random 1-layer Qwen2 (transformers then loads the
    tokenizer as Qwen2's)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("r1")
    texts = [prompt_text(r) + official_answer(r) for r in records()]
    from test_tokenizer_text import QWEN2_PAT
    pre = tokenizers.pre_tokenizers
    tk = tokenizers.Tokenizer(tokenizers.models.BPE())   # Qwen2's pre-tokenizer, as R1-Distill's
    tk.normalizer = tokenizers.normalizers.NFC()
    tk.pre_tokenizer = pre.Sequence([pre.Split(tokenizers.Regex(QWEN2_PAT), behavior="isolated"),
                                     pre.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": R1_TEMPLATE,
        # AddedToken dicts, as R1-Distill's config stores them
        **{k: {"__type": "AddedToken", "content": t, "lstrip": False, "normalized": True,
               "rstrip": False, "single_word": False}
           for k, t in (("bos_token", SPECIALS[0]), ("eos_token", SPECIALS[1]))}}))
    cfg = transformers.Qwen2Config(vocab_size=tk.get_vocab_size(), hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=16384, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    return d


def test_chat_template_equals_transformers(chat_dir):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(chat_dir)
    _, tok, _ = load_lang_model(chat_dir)
    for text in [prompt_text(r) for r in records()] + ["hi <｜User｜> there"]:
        messages = [{"role": "user", "content": text}]
        want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert want.startswith(SPECIALS[0] + SPECIALS[2]) and want.endswith("<think>\n")
        ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                     return_dict=False)
        assert tok.prompt(text) == list(ids), text[:80]
        assert tok.decode(tok.prompt(text)) == want


def scripted(texts, tok):
    """grpo_step's sampler: row i of each group writes texts[i] then EOS; the old log-probs are the
    model's own (one forward of prompt + answer)."""
    def sampler(model, prompts, items, cfg, generator):
        rows = [tok.encode(texts[i % len(texts)]) + [tok.eos_id] for i in range(len(prompts))]
        T = max(map(len, rows))
        tokens = torch.full((len(rows), T), -1)
        old = torch.zeros(len(rows), T)
        with torch.no_grad():
            for i, (p, row) in enumerate(zip(prompts, rows)):
                tokens[i, :len(row)] = torch.tensor(row)
                logits, _ = model(torch.tensor([p + row[:-1]]))
                lp = torch.log_softmax(logits[0, len(p) - 1:].float() / cfg.temperature, -1)
                old[i, :len(row)] = lp.gather(-1, torch.tensor(row)[:, None])[:, 0]
        return tokens, old, tokens >= 0
    return sampler


def test_paper_format_gets_reward_spread(chat_dir):
    """One GRPO step of the paper's recipe from the chat directory: the templated prompt, a group
    answered right once and wrong four times in the SFT models' format -> rewards 1, 0, 0, 0, 0, a
    kept group and a changed policy."""
    model, tok, _ = load_lang_model(chat_dir)
    rec = records()[2]   # objects created and removed, the score changes
    prompt = tok.prompt(prompt_text(rec))
    assert prompt[:2] == [tok.enc.encode_single_token(s) for s in SPECIALS[:3:2]]
    diff = make_diff(rec["state"], rec["next_state"])
    texts = [official_answer(rec)] + [official_answer(rec, dict(diff, removed=[]))] * 4
    cfg = GRPOConfig(**dict(PAPER_RECIPE["textgame"], prompts_per_step=1, micro_batch=5,
                            vocab=tok.n_vocab))
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    stats = grpo_step(model, copy.deepcopy(model).eval(), opt, [prompt],
                      [rec], Env(reward_fn("textgame", tok, "binary"), tok.eos_id, sampler=scripted(texts, tok)),
                      cfg, torch.Generator().manual_seed(0))
    assert stats["groups_kept"] == 1 and stats["reward_mean"] == pytest.approx(0.2)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_recipe_flags_and_clamp():
    p = subprocess.run([sys.executable, "train_lang.py", "--recipe=paper", "--task=webpage",
                        "--help"], cwd=ROOT, capture_output=True, text=True, check=True)
    help_text = " ".join(p.stdout.split())   # the recipe's values beside each RL flag's default
    assert "(200; --recipe=paper: textgame 4096, webpage 7288)" in help_text
    assert "(0.0001; --recipe=paper: textgame 1e-06, webpage 1e-06)" in help_text
    assert PAPER_RECIPE["textgame"]["minibatches"] == 2 and GRPOConfig().kl_clamp == 0
    logp, ref = torch.tensor([0.0, -20.0]), torch.tensor([-1.0, 0.0])
    assert torch.equal(k3_kl(logp, ref, 10.0), k3_kl(logp, ref).clamp(max=10))
    assert k3_kl(logp, ref)[1] > 10


def test_web_records_keep_the_papers_prompt(tmp_path):
    from data.webpage.prepare import import_file
    from data.webpage.task import prompt_text as web_prompt
    row = {"site": "shop", "observation": "[1] RootWebArea 'Home'", "action": "click [1]",
           "next_observation": "[1] RootWebArea 'Cart'", "prompt": "You are an intelligent agent"}
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    assert [web_prompt(r) for r in import_file(tmp_path / "in.jsonl", tmp_path / "out.jsonl")] \
        == [row["prompt"]]
