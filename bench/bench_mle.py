"""
MLE training step: tokens per second and model FLOPs utilisation (MFU) against this machine's measured matmul peak,
side by side with HF transformers training the same model on the same batch.

    python bench/bench_mle.py                # the text-game model (Llama-style 4 x 128), 1 and 2 threads
    python bench/bench_mle.py --tiny         # seconds; the smoke test in tests/test_bench.py

Peak: the median speed of a float32 square matmul (--peak_n, default 1024) at each thread count, the best this machine
does on dense math. One training step = forward, cross-entropy, backward, gradient clipping, AdamW. Our model and HF's
LlamaForCausalLM get the same weights (saved as safetensors, loaded into ours with `checkpoint.load_model`) and the same
batch; they run in turn after a warm-up and the median of the repeats is reported. Model FLOPs per token follow
`flops_per_token` (6 N + attention, PaLM appendix B), the same count for both.
"""
import argparse
import tempfile
import time

import torch

from common import interleaved, machine, median, print_table, thread_list

from checkpoint import load_model  # noqa: E402

# -----------------------------------------------------------------------------
# flags
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            allow_abbrev=False)
p.add_argument("--threads", default="1,2", help="torch thread counts to run, comma list")
p.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
p.add_argument("--peak_n", type=int, default=1024, help="side of the square matmul that measures the peak")
# workload (train_lang.py's defaults: batch 32 of text-game sequences, ~250 tokens)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--vocab", type=int, default=448)
p.add_argument("--tiny", action="store_true", help="smoke mode: 1 layer x 32, batch 2 x 16, peak on 128, 1 repeat")
args = p.parse_args()

import transformers  # noqa: E402  (bench-only reference: after the flags, so --help needs only requirements.txt)
if args.tiny:
    args.n_layer, args.n_embd, args.n_head, args.vocab, args.batch, args.seq = 1, 32, 2, 64, 2, 16
    args.peak_n, args.repeats, args.threads = 128, 1, "1"


def matmul_peak(n, repeats):
    a, b = torch.randn(n, n), torch.randn(n, n)
    reps = max(1, int(2e9 // (2 * n ** 3)))  # ~2 GFLOP per timing

    def run():
        for _ in range(reps):
            a @ b
    t = interleaved({"mm": run}, repeats)["mm"]
    return 2 * n ** 3 * reps / median(t)


def models(path):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=4 * args.n_embd,
                                   num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
                                   max_position_embeddings=args.seq, tie_word_embeddings=True, bos_token_id=0,
                                   eos_token_id=0, pad_token_id=0)
    hf = transformers.LlamaForCausalLM(cfg)
    hf.save_pretrained(path, safe_serialization=True)
    return load_model(path)[0].train(), hf.train()


def flops_per_token(model, T):
    """Training FLOPs per token (forward + backward) of our GPT at sequence length T, as in the PaLM paper's
    appendix B: 6 x the non-embedding weights, the LM head (tied: its matrix is the embedding's), the attention."""
    c = model.config
    attention = 12 * c.n_layer * c.n_head * c.head_dim * T
    return 6 * model.num_params() + 6 * c.vocab_size * c.n_embd + attention


def trainer(model, step_loss):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = step_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


# -----------------------------------------------------------------------------
print(f"machine: {machine()}")
print(f"workload: batch {args.batch} x {args.seq} tokens, model {args.n_layer} layers x {args.n_embd} (Llama-style), "
      f"vocab {args.vocab}; median of {args.repeats}")
with tempfile.TemporaryDirectory() as d:
    ours, hf = models(d)
g = torch.Generator().manual_seed(0)
x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
y = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
flops = flops_per_token(ours, args.seq) * args.batch * args.seq
rows = []
for threads in thread_list(args.threads):
    torch.set_num_threads(threads)
    peak = matmul_peak(args.peak_n, args.repeats)
    steps = {"ours": trainer(ours, lambda: ours(x, y)[1]),
             "hf": trainer(hf, lambda: hf(input_ids=x, labels=torch.cat([x[:, 1:], y[:, -1:]], 1)).loss)}
    t0 = time.perf_counter()
    t = interleaved(steps, args.repeats)
    for name in ("ours", "hf"):
        sec = median(t[name])
        rows.append([name if name == "ours" else "HF transformers", threads, f"{sec:.3f}",
                     f"{args.batch * args.seq / sec:,.0f}", f"{flops / sec / 1e9:.1f}", f"{peak / 1e9:.1f}",
                     f"{flops / sec / peak:.1%}"])
    rows[-2].append(f"**{median(t['hf']) / median(t['ours']):.2f}x** HF")
    rows[-1].append("")
print_table(["model", "threads", "s/step", "tokens/s", "model GFLOP/s", "matmul peak GFLOP/s", "MFU", "speed"], rows,
            "MLE training step (forward + backward + AdamW)")
