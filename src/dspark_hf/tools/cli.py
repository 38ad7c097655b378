"""`dspark`: the console command (generate, train, regenerate, export, bench, calibrate, demo).

A bad input ends with one line naming what is wrong and how to fix it, and a non-zero
exit; `dspark --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import torch

from ..core.trace import summarize
from ..formats.loader import WRITABLE, DSparkDrafter, HubFetchError
from . import bench, calibrate, demo
from .errors import USER_ERRORS, InputError, non_negative_float, positive_int
from .options import (
    DTYPES,
    HelpFormatter,
    add_model_arguments,
    add_sampling_arguments,
    announce,
    apply_threads,
    load_pair_from_args,
    load_target_from_args,
    resolve_dtype,
    sampling_kwargs,
    timed_generate,
)
from .prompts import read_prompts, render_prompt
from .targets import load_target


# ------------------------------------------------------------------ generate
def cmd_generate(args) -> None:
    from transformers import TextStreamer

    target, tokenizer, drafter = load_pair_from_args(args)
    settings = {} if args.threshold is None else {"assistant_confidence_threshold": args.threshold}
    tokens, seconds = timed_generate(
        target,
        render_prompt(tokenizer, args.prompt),
        max_new_tokens=args.max_new_tokens,
        assistant_model=drafter,
        streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True),
        **settings,
        **sampling_kwargs(args.temperature),
    )
    summary = summarize(drafter.last_trace)
    new_tokens = len(tokens)
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
    from .training.processes import process_state
    from .training.trainer import TrainSettings, choose_mask_token, train

    if not (args.prompts or args.data or args.text):
        raise InputError("give training data: --prompts (the target answers them), --data, or --text.")
    # Every input is read before a model loads, and before --out exists: a bad file costs nothing.
    prompts = read_prompts(args.prompts, limit=args.max_prompts) if args.prompts else None
    sequences = [r for path in args.data or [] for r in load_sequences(path)]
    texts = [Path(path).read_text(errors="replace") for path in args.text or []]
    eval_sequences = [r for path in args.eval_data for r in load_sequences(path)] if args.eval_data else None
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill saves the last finished step too
    state = process_state(args.device)
    device = args.device or str(state.device)  # under accelerate launch: this process's own GPU
    threads_why = apply_threads(args)
    target, tokenizer = load_target(args.target, dtype=resolve_dtype(args.dtype, device), device=device,
                                    local_files_only=args.local_files_only)
    if state.is_main_process:
        announce(args, target, threads_why)
    torch.manual_seed(args.seed)

    out = Path(args.out)
    if prompts is not None:
        regenerated = out / "regenerated.jsonl"
        regenerate(target, tokenizer, prompts, regenerated, batch_size=args.regen_batch_size,
                   max_new_tokens=args.max_new_tokens)
        sequences = load_sequences(regenerated)
    sequences += tokenize_texts(tokenizer, texts)

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
        autocast=args.autocast,
        init=args.init,
        save_every=args.save_every,
        log_every=args.log_every,
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
        device=device,
        eval_sequences=eval_sequences,
    )
    if state.is_main_process:
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
        drafter.save_pretrained(out, include_shared_weights=args.include_shared_weights, dtype=dtype)
        print(json.dumps({"out": str(out), "steps": settings.max_steps, "sequences": len(sequences)}))


# ------------------------------------------------------------------ regenerate
def cmd_regenerate(args) -> None:
    from .training.data import regenerate
    from .training.processes import process_state

    prompts = read_prompts(args.prompts, limit=args.max_prompts)
    state = process_state(args.device)
    if args.device is None and args.device_map is None:
        args.device = str(state.device)  # the GPU when there is one; under accelerate launch, this process's own
    target, tokenizer = load_target_from_args(args)
    torch.manual_seed(args.seed)
    done = regenerate(
        target,
        tokenizer,
        prompts,
        args.out,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        min_prompt_tokens=args.min_prompt_tokens,
        temperature=args.temperature,
        samples_per_prompt=args.samples_per_prompt,
    )
    if state.is_main_process:
        print(json.dumps({"out": str(args.out), "answers": done.answers, "skipped": done.skipped,
                          "hours": round(done.seconds / 3600, 3), "answers_per_hour": round(done.answers_per_hour)}))


# ------------------------------------------------------------------ export
def cmd_export(args) -> None:
    target, _ = load_target_from_args(args, tokenizer=False)  # float32: the drafter is written as it is stored
    drafter = DSparkDrafter.from_pretrained(args.src, target, local_files_only=args.local_files_only)
    drafter.save_pretrained(args.out, format=args.format)
    print(json.dumps({"src": str(args.src), "out": str(args.out), "format": args.format}))


# ------------------------------------------------------------------ the parser
def build_parser() -> argparse.ArgumentParser:
    formatter = HelpFormatter
    parser = argparse.ArgumentParser(prog="dspark", description="DSpark speculative decoding for transformers")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser(
        "generate", help="answer one prompt with a drafter and print the round statistics", formatter_class=formatter
    )
    add_model_arguments(gen)
    gen.add_argument("--prompt", default="What is 17 * 23? Explain step by step.",
                     help="the user message, put in the target's chat template")
    add_sampling_arguments(gen)
    gen.set_defaults(func=cmd_generate)

    tr = commands.add_parser(
        "train", help="train a DSpark or DFlash drafter for a target (also under accelerate launch)",
        formatter_class=formatter,
    )
    tr.add_argument("--target", required=True, help="Hub id or directory ('smollm2': offline default)")
    tr.add_argument("--local-files-only", action="store_true", help="never reach the Hub; use its cache only")
    tr.add_argument("--dtype", choices=["auto", *DTYPES], default="float32",
                    help="the target's dtype while it computes the features the drafter learns from; auto: bfloat16 "
                    "where the hardware multiplies it natively")
    tr.add_argument("--threads", type=positive_int, default=None,
                    help="torch CPU threads per process; unset: OMP_NUM_THREADS, else the cores not already busy")
    source = tr.add_mutually_exclusive_group()
    source.add_argument("--prompts", nargs="+", help='jsonl files of {"turns": [...]}; the target regenerates answers')
    source.add_argument("--data", nargs="+", help="already regenerated jsonl (prompt_ids/response_ids records)")
    tr.add_argument("--text", nargs="+", help="plain text files the target only reads (alone, or added to the above)")
    tr.add_argument("--out", required=True, help="directory for the drafter, its checkpoints and log")
    tr.add_argument("--arch", choices=["dspark", "dflash"], default="dspark",
                    help="dspark: Markov and confidence heads; dflash: the parallel drafter alone")
    tr.add_argument("--block-size", type=positive_int, default=7, help="block length: the anchor plus draft slots")
    tr.add_argument("--layers", type=positive_int, default=1, help="draft decoder layers")
    tr.add_argument("--markov-rank", type=positive_int, default=64, help="rank of the Markov head's bias")
    tr.add_argument("--markov-head", choices=["vanilla", "gated", "rnn"], default="vanilla",
                    help="how the previous token's feature is mixed in")
    tr.add_argument("--target-layer-ids", type=int, nargs="+", default=None,
                    help="target layers whose hidden states the drafter reads (default: spread over the depth)")
    tr.add_argument("--num-target-features", type=positive_int, default=4, help="layers read when ids are not given")
    tr.add_argument("--mask-token-id", type=int, default=None,
                    help="token id filling the draft slots (default: the tokenizer's mask token, else an unused slot or unk)")
    tr.add_argument("--draft-vocab", type=positive_int, default=None,
                    help="prune the draft vocabulary to the N most frequent answer tokens (FR-Spec); saved as d2t")
    tr.add_argument("--max-steps", type=int, default=1000, help="optimizer steps in all (a resumed run counts on)")
    tr.add_argument("--batch-size", type=positive_int, default=4,
                    help="sequences per optimizer step over all processes (the global batch); each process runs its "
                    "share one sequence per forward/backward pass and accumulates, so any batch fits in memory")
    tr.add_argument("--anchors", type=positive_int, default=32, help="anchors (blocks) per sequence")
    tr.add_argument("--max-tokens", type=positive_int, default=768, help="tokens per training sequence")
    tr.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (cosine decay after warm-up)")
    tr.add_argument("--warmup-steps", type=int, default=50, help="steps of linear learning-rate warm-up")
    tr.add_argument(
        "--loss-vocab",
        choices=["full", "responses"],
        default="full",
        help="'responses': the loss scores only tokens seen in the training answers (several times cheaper on CPU)",
    )
    tr.add_argument("--autocast", choices=["auto", "bf16", "off"], default="auto",
                    help="bf16 autocast of the drafter's passes; auto: on CUDA GPUs with bf16, off on CPUs "
                    "(bf16 there is untested for speed)")
    tr.add_argument("--save-every", type=positive_int, default=100, help="steps between resumable checkpoints")
    tr.add_argument("--log-every", type=positive_int, default=10, help="steps per line of OUT/train_log.jsonl")
    tr.add_argument("--eval-data", nargs="+", default=None,
                    help="held-out regenerated answers: their greedy tau is logged every --eval-every steps")
    tr.add_argument("--eval-every", type=positive_int, default=500, help="steps between held-out tau evaluations")
    tr.add_argument("--seed", type=int, default=0, help="initialisation and data order")
    tr.add_argument("--max-prompts", type=positive_int, default=None, help="with --prompts: answer only the first N")
    tr.add_argument("--max-new-tokens", type=positive_int, default=256, help="regenerated response length")
    tr.add_argument("--regen-batch-size", type=positive_int, default=16, help="with --prompts: prompts answered at once")
    tr.add_argument("--feature-cache", default=None, help="directory to keep target features between epochs")
    tr.add_argument("--device", default=None, help="unset: each process's own GPU, else the CPU")
    tr.add_argument("--resume", action="store_true", help="continue OUT/checkpoint; the process count may differ")
    tr.add_argument("--init-from", default=None, help="start from this drafter's weights (new optimizer and schedule)")
    tr.add_argument("--init", choices=("random", "target"), default="random",
                    help="a fresh run's draft layers: random, or copies of the target's deepest layers (slower "
                         "to train in the README's lever study)")
    tr.add_argument(
        "--trainable",
        choices=["all", "confidence"],
        default="all",
        help="'confidence': fit only the confidence head, e.g. on answers held out from the backbone's training",
    )
    tr.add_argument("--include-shared-weights", action="store_true", help="also store embed_tokens/lm_head copies")
    tr.add_argument("--save-dtype", choices=["bf16", "fp32"], default="fp32", help="dtype of the saved weights")
    tr.set_defaults(func=cmd_train)

    rg = commands.add_parser(
        "regenerate", help="write the target's own answers to prompts, for training (resumable)",
        formatter_class=formatter,
    )
    add_model_arguments(rg, drafter=False)
    rg.add_argument("--prompts", nargs="+", required=True,
                    help='jsonl files of {"turns": [...]} (read round-robin), or shipped set names')
    rg.add_argument("--out", required=True, help="jsonl to append answers to; a rerun continues it")
    rg.add_argument("--max-prompts", type=positive_int, default=None, help="only the first N prompts (round-robin)")
    rg.add_argument("--max-prompt-tokens", type=positive_int, default=512, help="skip longer prompts")
    rg.add_argument("--min-prompt-tokens", type=int, default=0,
                    help="skip shorter prompts (answers for a band of lengths an earlier file skipped)")
    rg.add_argument("--max-new-tokens", type=positive_int, default=256, help="most tokens per answer")
    rg.add_argument("--batch-size", type=positive_int, default=32, help="prompts per generate() call, per process")
    rg.add_argument("--temperature", type=non_negative_float, default=0.0,
                    help="0: the greedy answer; above 0: sampled answers, for breadth (write them to their own file)")
    rg.add_argument("--samples-per-prompt", type=positive_int, default=1, help="sampled answers per prompt")
    rg.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    rg.set_defaults(func=cmd_regenerate)

    ex = commands.add_parser("export", help="write a drafter in another checkpoint layout", formatter_class=formatter)
    ex.add_argument("src", help="drafter: Hub id or directory, any supported layout")
    ex.add_argument("out", help="output directory")
    ex.add_argument("--format", choices=WRITABLE, default="deepspec", help="the layout to write")
    add_model_arguments(ex, drafter=False, placement=False)
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


def error_line(error: Exception) -> str:
    """A user error in command-line terms."""
    if isinstance(error, HubFetchError):
        return error.message(offline_switch="--local-files-only")
    return str(error) if not isinstance(error, FileNotFoundError) else f"{error.filename}: no such file."


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        sys.exit(f"dspark {args.command}: error: {error_line(error)}")
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"dspark {args.command}: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as shells report it


if __name__ == "__main__":
    main()
