"""
GRPO step time: our grpo.py against TRL's GRPOTrainer, same tiny GPT-2, prompts, reward and settings, on CPU.

    pip install -r requirements-dev.txt      # trl, datasets, accelerate (bench and tests only)
    python bench/bench_grpo.py               # 1 and 2 threads, 5 timed steps each after 1 warm-up
    python bench/bench_grpo.py --tiny        # seconds; the smoke test in tests/test_bench.py (skipped without trl)

Setup, identical on both sides: a random GPT-2 (4 x 128 by default) and a byte-level BPE tokenizer trained here on
text-game prompts are saved to a temporary directory; TRL loads its policy and its reference model from it, we load
ours with `checkpoint.load_model` plus a frozen copy as the reference. Each step takes 4 text-game prompts (the real
`data/textgame` prompts, ~150-220 tokens) x G=8 samples at T=1, up to 64 completion tokens (both stop at EOS), scores
them with the same Python reward on the decoded text, and makes one AdamW update on all of them with a KL penalty
(beta > 0, so both run the reference model). Our dynamic sampling is off (`skip_zero_std=False`, no prompt source:
one sampling round; TRL has none), there is no entropy bonus (TRL's loss has none), so both learn from every group. TRL runs offline on CPU (`use_cpu=True, bf16=False`, no logging, no saving).

Timing is interleaved: a Trainer callback starts a clock at TRL's `on_step_begin` and stops it at `on_step_end`
(generation, reward, reference and policy passes and the optimizer step all happen in between), then runs and times
one of our `grpo_step`s before TRL's next step, so background load hits both alike. Medians are reported, of wall time
and of process CPU time (which other processes' load does not inflate).
"""
import argparse
import copy
import logging
import os
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from common import machine, median, print_table, thread_list  # noqa: E402

from data.textgame.prepare import generate_split  # noqa: E402
from data.textgame.task import prompt_text  # noqa: E402
from grpo import Env, GRPOConfig, grpo_step  # noqa: E402
from checkpoint import load_model  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
p.add_argument("--threads", default="1,2", help="torch thread counts to run, comma list")
p.add_argument("--repeats", type=int, default=5, help="timed steps per side (median reported), after one warm-up")
# workload
p.add_argument("--prompts", type=int, default=4, help="prompts per step")
p.add_argument("--group", type=int, default=8, help="G samples per prompt")
p.add_argument("--max_new_tokens", type=int, default=64)
p.add_argument("--beta", type=float, default=0.04)
p.add_argument("--lr", type=float, default=1e-5)
# model
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--vocab", type=int, default=512)
p.add_argument("--tiny", action="store_true", help="smoke mode: 1 layer x 32, 2 prompts x 4, 8 tokens, 1 step")
args = p.parse_args()

# bench-only reference libraries (requirements-dev.txt): after the flags, so --help needs only requirements.txt
import datasets  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

if args.tiny:
    args.n_layer, args.n_embd, args.n_head, args.vocab = 1, 32, 2, 300
    args.prompts, args.group, args.max_new_tokens, args.repeats, args.threads = 2, 4, 8, 1, "1"


# -----------------------------------------------------------------------------
# the shared setup: tokenizer, model directory, prompts, reward

def build(path):
    records = generate_split("train", 256, 0)
    texts = [prompt_text(r) for r in records]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                               pad_token="<|endoftext|>")
    tok.save_pretrained(path)
    longest = max(len(tok(t)["input_ids"]) for t in texts)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=longest + args.max_new_tokens + 8,
                                  n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                                  bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path, safe_serialization=True)
    return tok, texts


def reward_of_text(text):
    """Share of JSON punctuation in the text: cheap, verifiable, and it varies between random samples."""
    return sum(ch in '{}[]":,' for ch in text) / max(1, len(text))


def trl_reward(completions, **kw):
    return [reward_of_text(c) for c in completions]


# -----------------------------------------------------------------------------
# one interleaved run per thread count

def bench(threads, path, tok, texts):
    torch.set_num_threads(threads)
    n_steps = args.repeats + 1
    P, G = args.prompts, args.group
    # TRL: each step takes P new prompts (repeated G times by its sampler); ours takes the same P prompts
    step_texts = [texts[(s * P + i) % len(texts)] for s in range(n_steps) for i in range(P)]
    dataset = datasets.Dataset.from_dict({"prompt": step_texts})
    out = tempfile.mkdtemp()
    config = trl.GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                            logging_steps=10_000, disable_tqdm=True, max_steps=n_steps, learning_rate=args.lr,
                            per_device_train_batch_size=P * G, num_generations=G, gradient_accumulation_steps=1,
                            steps_per_generation=1, num_iterations=1, max_completion_length=args.max_new_tokens,
                            temperature=1.0, top_k=0, top_p=1.0, beta=args.beta, shuffle_dataset=False, seed=0,
                            dataloader_num_workers=0)
    trainer = trl.GRPOTrainer(model=path, reward_funcs=trl_reward, args=config, train_dataset=dataset,
                              processing_class=tok)
    ours = load_model(path)[0]
    ref = copy.deepcopy(ours).eval()
    opt = torch.optim.AdamW(ours.parameters(), lr=args.lr)
    cfg = GRPOConfig(group_size=G, prompts_per_step=P, max_new_tokens=args.max_new_tokens, temperature=1.0,
                     beta=args.beta, entropy_coef=0.0, ppo_epochs=1, minibatches=1, micro_batch=P * G,
                     skip_zero_std=False)
    gen = torch.Generator().manual_seed(0)
    eos = tok.eos_token_id

    def reward_fn(items, completions):
        return [reward_of_text(tok.decode(c, skip_special_tokens=True)) for c in completions]

    times = {"trl": [], "ours": []}
    lens = {"trl": [], "ours": []}

    class Interleave(transformers.TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, a, state, *rest, **kw):
            times["trl"].append((time.perf_counter() - self.t0, time.process_time() - self.c0))
            s = state.global_step - 1
            prompts = [tok(t)["input_ids"] for t in step_texts[s * P:(s + 1) * P]]
            t0, c0 = time.perf_counter(), time.process_time()
            stats = grpo_step(ours, ref, opt, prompts, [None] * P, Env(reward_fn, eos), cfg, gen, s)
            assert stats["rounds"] == 1 and stats["groups_kept"] == P, "both sides must learn from every group"
            times["ours"].append((time.perf_counter() - t0, time.process_time() - c0))
            lens["ours"].append(stats["response_len"])
            assert torch.get_num_threads() == threads, "a library changed the thread count"

    trainer.add_callback(Interleave())
    trainer.train()
    lens["trl"] = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    row = [threads]
    for k in ("ours", "trl"):
        t = times[k][1:] if len(times[k]) > 1 else times[k]  # the first step of each side is the warm-up
        row.append((median([w for w, _ in t]), median([c for _, c in t])))
    (ow, oc), (tw, tc) = row[1], row[2]
    mean_len = {k: sum(v) / len(v) if v else float("nan") for k, v in lens.items()}
    return [threads, f"{ow:.3f}", f"{tw:.3f}", f"**{tw / ow:.1f}x**", f"{oc:.3f}", f"{tc:.3f}", f"{tc / oc:.1f}x",
            f"{mean_len['ours']:.1f} / {mean_len['trl']:.1f}"]


# -----------------------------------------------------------------------------
transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()
logging.getLogger("trl").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
print(f"machine: {machine()}")
print(f"trl {trl.__version__}, transformers {transformers.__version__}; workload: {args.prompts} prompts x G={args.group}, "
      f"<= {args.max_new_tokens} new tokens, beta {args.beta}, one update per batch; model {args.n_layer} layers x "
      f"{args.n_embd}, vocab {args.vocab}; median of {args.repeats} steps")
with tempfile.TemporaryDirectory() as d:
    tok, texts = build(d)
    print(f"prompts: {min(len(tok(t)['input_ids']) for t in texts)}-{max(len(tok(t)['input_ids']) for t in texts)} tokens")
    rows = [bench(n, d, tok, texts) for n in thread_list(args.threads)]
print_table(["threads", "ours s/step", "TRL s/step", "TRL / ours", "ours CPU s", "TRL CPU s", "CPU ratio",
             "mean completion len (ours / TRL)"], rows, "GRPO step (seconds per step; lower is better)")
