"""`dspark`: the console command (generate, train, export, bench, calibrate, demo).

A bad input ends with one line naming what is wrong and how to fix it, and a non-zero
exit; `dspark --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import torch

from ..core.trace import summarize
from ..formats.loader import WRITABLE, DSparkDrafter
from . import bench, calibrate, demo
from .errors import USER_ERRORS, InputError, positive_int, probability
from .prompts import read_prompts, render_prompt
from .targets import DEFAULT_TARGET, load_pair, load_target

def add_model_arguments(parser, drafter_help: str = "Hub id or directory (default: the drafter shipped for smollm2)"):
    parser.add_argument("--target", default=DEFAULT_TARGET, help="Hub id or directory ('smollm2': offline default)")
    parser.add_argument("--drafter", default=None, help=drafter_help)
    parser.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")


# ------------------------------------------------------------------ generate
def cmd_generate(args) -> None:
    from transformers import TextStreamer

    target, tokenizer, drafter = load_pair(args.target, args.drafter, args.local_files_only)
    prompt_ids = torch.tensor([render_prompt(tokenizer, args.prompt)])
    sampling = dict(do_sample=True, temperature=args.temperature) if args.temperature > 0 else dict(do_sample=False)
    settings = {} if args.threshold is None else {"assistant_confidence_threshold": args.threshold}
    started = time.perf_counter()
    output = target.generate(
        prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=args.max_new_tokens,
        assistant_model=drafter,
        streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
        **settings,
        **sampling,
    )
    seconds = time.perf_counter() - started
    summary = summarize(drafter.last_trace)
    new_tokens = output.shape[1] - prompt_ids.shape[1]
    print(
        f"\n[dspark] {new_tokens} tokens in {seconds:.2f} s ({new_tokens / seconds:.1f} tok/s), {summary.rounds} rounds, "
        f"tau {summary.tau:.2f}, verify rate {summary.verify_rate:.2f}, "
        f"draft {summary.draft_seconds:.2f} s / verify {summary.verify_seconds:.2f} s",
        file=sys.stderr,
    )


# ------------------------------------------------------------------ train
def cmd_train(args) -> None:
    from ..core.config import DSparkConfig, zlab_default_layer_ids
    from .training.data import load_sequences, regenerate, tokenize_texts
    from .training.trainer import TrainSettings, choose_mask_token, train

    if not (args.prompts or args.data or args.text):
        raise InputError("give training data: --prompts (the target answers them), --data, or --text.")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill saves the last finished step too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_target(args.target, device=args.device, local_files_only=args.local_files_only)
    torch.manual_seed(args.seed)

    if args.data:
        sequences = [r for path in args.data for r in load_sequences(path)]
    elif args.prompts:
        regenerated = out / "regenerated.jsonl"
        regenerate(
            target,
            tokenizer,
            read_prompts(args.prompts, limit=args.max_prompts),
            regenerated,
            batch_size=args.regen_batch_size,
            max_new_tokens=args.max_new_tokens,
        )
        sequences = load_sequences(regenerated)
    else:
        sequences = []
    if args.text:
        sequences += tokenize_texts(tokenizer, [Path(p).read_text(errors="replace") for p in args.text])

    depth = target.config.get_text_config().num_hidden_layers
    vocab = target.get_input_embeddings().weight.shape[0]
    dflash = args.arch == "dflash"
    config = DSparkConfig.for_target(
        target.config,
        num_hidden_layers=args.layers,
        target_layer_ids=args.target_layer_ids or zlab_default_layer_ids(depth, args.num_target_features),
        block_size=args.block_size,
        mask_token_id=args.mask_token_id if args.mask_token_id is not None else choose_mask_token(tokenizer, vocab),
        markov_rank=0 if dflash else args.markov_rank,
        markov_head_type=None if dflash else args.markov_head,
        enable_confidence_head=not dflash,
        confidence_head_with_markov=not dflash,
        draft_vocab_size=args.draft_vocab,
    )
    settings = TrainSettings(
        max_steps=args.max_steps,
        sequences_per_step=args.batch_size,
        anchors_per_sequence=args.anchors,
        max_tokens=args.max_tokens,
        learning_rate=args.lr,
        warmup_steps=args.warmup_steps,
        loss_vocab=args.loss_vocab,
        trainable=args.trainable,
        save_every=args.save_every,
        eval_every=args.eval_every,
        seed=args.seed,
    )
    drafter = train(
        target,
        sequences,
        out,
        config=config,
        settings=settings,
        arch=args.arch,
        resume=args.resume,
        init_from=args.init_from,
        feature_cache=args.feature_cache,
        device=args.device,
        eval_sequences=[r for path in args.eval_data for r in load_sequences(path)] if args.eval_data else None,
    )
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
    drafter.save_pretrained(out, include_shared_weights=args.include_shared_weights, dtype=dtype)
    print(json.dumps({"out": str(out), "steps": settings.max_steps, "sequences": len(sequences)}))


# ------------------------------------------------------------------ export
def cmd_export(args) -> None:
    target, _ = load_target(args.target, local_files_only=args.local_files_only, tokenizer=False)
    drafter = DSparkDrafter.from_pretrained(args.src, target, local_files_only=args.local_files_only)
    drafter.save_pretrained(args.out, format=args.format)
    print(json.dumps({"src": str(args.src), "out": str(args.out), "format": args.format}))


# ------------------------------------------------------------------ the parser
def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="dspark", description="DSpark speculative decoding for transformers")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser(
        "generate", help="answer one prompt with a drafter and print the round statistics", formatter_class=formatter
    )
    add_model_arguments(gen)
    gen.add_argument("--prompt", default="What is 17 * 23? Explain step by step.")
    gen.add_argument("--max-new-tokens", type=positive_int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--threshold", type=probability, default=None,
                     help="assistant_confidence_threshold (default: the drafter's generation_config)")
    gen.set_defaults(func=cmd_generate)

    tr = commands.add_parser("train", help="train a DSpark or DFlash drafter for a target", formatter_class=formatter)
    tr.add_argument("--target", required=True, help="Hub id or directory ('smollm2': offline default)")
    tr.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    source = tr.add_mutually_exclusive_group()
    source.add_argument("--prompts", nargs="+", help='jsonl files of {"turns": [...]}; the target regenerates answers')
    source.add_argument("--data", nargs="+", help="already regenerated jsonl (prompt_ids/response_ids records)")
    tr.add_argument("--text", nargs="+", help="plain text files the target only reads (alone, or added to the above)")
    tr.add_argument("--out", required=True)
    tr.add_argument("--arch", choices=["dspark", "dflash"], default="dspark")
    tr.add_argument("--block-size", type=positive_int, default=7)
    tr.add_argument("--layers", type=positive_int, default=1, help="draft decoder layers")
    tr.add_argument("--markov-rank", type=positive_int, default=64)
    tr.add_argument("--markov-head", choices=["vanilla", "gated", "rnn"], default="vanilla")
    tr.add_argument("--target-layer-ids", type=int, nargs="+", default=None)
    tr.add_argument("--num-target-features", type=positive_int, default=4, help="layers read when ids are not given")
    tr.add_argument("--mask-token-id", type=int, default=None)
    tr.add_argument("--draft-vocab", type=positive_int, default=None,
                    help="prune the draft vocabulary to the N most frequent answer tokens (FR-Spec); saved as d2t")
    tr.add_argument("--max-steps", type=int, default=1000)
    tr.add_argument("--batch-size", type=positive_int, default=4, help="sequences per optimizer step")
    tr.add_argument("--anchors", type=positive_int, default=32, help="anchors (blocks) per sequence")
    tr.add_argument("--max-tokens", type=positive_int, default=768, help="tokens per training sequence")
    tr.add_argument("--lr", type=float, default=6e-4)
    tr.add_argument("--warmup-steps", type=int, default=50)
    tr.add_argument(
        "--loss-vocab",
        choices=["full", "responses"],
        default="full",
        help="'responses': the loss scores only tokens seen in the training answers (several times cheaper on CPU)",
    )
    tr.add_argument("--save-every", type=positive_int, default=100)
    tr.add_argument("--eval-data", nargs="+", default=None,
                    help="held-out regenerated answers: their greedy tau is logged every --eval-every steps")
    tr.add_argument("--eval-every", type=positive_int, default=500)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--max-prompts", type=positive_int, default=None)
    tr.add_argument("--max-new-tokens", type=positive_int, default=256, help="regenerated response length")
    tr.add_argument("--regen-batch-size", type=positive_int, default=16)
    tr.add_argument("--feature-cache", default=None, help="directory to keep target features between epochs")
    tr.add_argument("--device", default=None)
    tr.add_argument("--resume", action="store_true")
    tr.add_argument("--init-from", default=None, help="start from this drafter's weights (new optimizer and schedule)")
    tr.add_argument(
        "--trainable",
        choices=["all", "confidence"],
        default="all",
        help="'confidence': fit only the confidence head, e.g. on answers held out from the backbone's training",
    )
    tr.add_argument("--include-shared-weights", action="store_true", help="also store embed_tokens/lm_head copies")
    tr.add_argument("--save-dtype", choices=["bf16", "fp32"], default="fp32")
    tr.set_defaults(func=cmd_train)

    ex = commands.add_parser("export", help="write a drafter in another checkpoint layout", formatter_class=formatter)
    ex.add_argument("src", help="drafter: Hub id or directory, any supported layout")
    ex.add_argument("out", help="output directory")
    ex.add_argument("--format", choices=WRITABLE,
                    default="deepspec")
    ex.add_argument("--target", default=DEFAULT_TARGET, help="the target the drafter was made for")
    ex.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    ex.set_defaults(func=cmd_export)

    bench.add_arguments(
        commands.add_parser("bench", help="tau and tokens/s against the baselines", formatter_class=formatter)
    )
    calibrate.add_arguments(
        commands.add_parser(
            "calibrate", help="fit STS confidence temperatures (and re-profile the cost table)", formatter_class=formatter
        )
    )
    demo.add_arguments(
        commands.add_parser("demo", help="Gradio demo: watch every drafting round", formatter_class=formatter)
    )
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        message = str(error) if not isinstance(error, FileNotFoundError) else f"{error.filename}: no such file."
        sys.exit(f"dspark {args.command}: error: {message}")


if __name__ == "__main__":
    main()
