"""
The regime study's knobs: MLE from scratch on a fraction of the train labels (RLVR and the control
still see every record), RLVR on a small prompt pool (the first N train records: does the
optimiser climb where it has seen every prompt?), and another share of unchanged prompts.

    python research/labels.py --label_frac=0.1 --out_dir=out/textgame_frac10
    python research/labels.py --rl_pool=64 --rl_steps=100 --out_dir=out/textgame_pool64
    python research/labels.py --rl_unchanged_frac=0 --out_dir=out/textgame_unch0
    python research/labels.py --label_frac=0.1 --mle_steps=600 --rl_steps=0 --out_dir=out/lf10
                                   # the weak start alone (checkpoints/textgame/mle_lf10)

--label_frac < 1 trains the MLE start here (train_lang.py's model, tokenizer and schedule);
otherwise the start is --init (the shipped checkpoint). Writes what train_lang.py writes.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root
import mle  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from research import common  # noqa: E402
from runtime import lr_at  # noqa: E402
from tasks import TASKS, encode, load_lang_model  # noqa: E402
from tokenizer_text import Tokenizer  # noqa: E402


def mle_on_fraction(run, args, train, val):
    """train_lang.py's MLE from scratch (its model, BPE on every train record, its schedule) on
    a seeded share --label_frac of the train pairs -> (checkpoint, tokenizer)."""
    data = TASKS[args.task].data
    tok_file = run.out_dir / "tokenizer_labels.tiktoken"   # beside the start's copied one
    if not tok_file.is_file():
        Tokenizer.train([data.prompt_text(r) + data.target_text(r) for r in train],
                        448).save(tok_file)
    tok = Tokenizer.from_tiktoken_file(tok_file)
    # in the checkpoints' args: the tokenizer, and the schedule the control's rate is read from
    run.recorded.update(tokenizer=str(tok_file), mle_lr=3e-3)
    pairs = [encode(args.task, tok, r) for r in train]
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed)).tolist()
    pairs = [pairs[i] for i in order[:max(1, round(args.label_frac * len(pairs)))]]
    model = GPT(GPTConfig.llama(vocab_size=tok.n_vocab, block_size=512, n_layer=4, n_head=4,
                                n_embd=128))
    fits = [pr for pr in pairs if len(pr[0]) + len(pr[1]) <= 513]
    val_pairs = [pr for pr in (encode(args.task, tok, r) for r in val[:256])
                 if len(pr[0]) + len(pr[1]) <= 513]
    next_batch, val_loss = mle.pair_batches(run, fits, val_pairs, args.batch_size)
    ckpt = run.out_dir / "mle.safetensors"
    mle.train(run, model, "mle", ckpt, args.mle_steps, next_batch, val_loss,
              lambda s: lr_at(s, args.mle_steps, 3e-3, mle.WARMUP), weight_decay=0.1,
              eval_every=500)
    return str(ckpt), tok


def main():
    p = common.parser(__doc__)
    p.add_argument("--label_frac", type=float, default=1.0, help="share of the labels MLE sees")
    p.add_argument("--mle_steps", type=int, default=2000, help="MLE steps (--label_frac < 1)")
    p.add_argument("--rl_pool", type=int, default=0, help="RL prompts: the first N records")
    p.add_argument("--rl_unchanged_frac", type=float, default=common.UNCHANGED_FRAC)
    args = p.parse_args()
    if not 0 < args.label_frac <= 1 or not 0 <= args.rl_unchanged_frac <= 1:
        p.error("--label_frac must be in (0, 1] and --rl_unchanged_frac in [0, 1]")
    run, (train, val, test), init, model, tok = common.setup(args, ["mle.safetensors",
                                                                      "rlvr.safetensors"])
    if args.label_frac < 1:
        init, tok = mle_on_fraction(run, args, train, val)
        model = load_lang_model(init, run.device)[0]
    if args.rl_steps == 0:   # the start alone: the weak start that train_lang.py --init= names
        return run.print0(f"wrote {init}")
    rl = common.rlvr(run, model, tok, args, train[:args.rl_pool or None],
                     unchanged_frac=args.rl_unchanged_frac)
    common.compare(run, tok, args, init, rl, train, val, test)


if __name__ == "__main__":
    main()
