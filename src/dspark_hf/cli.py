"""`dspark` console command: generate, train (and the tools built on them)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import torch

DEFAULT_TARGET = "smollm2"  # the offline default target, see dspark_hf.smollm2


def load_target(name_or_path: str, dtype=torch.float32, device: str | None = None):
    """A target and its tokenizer; 'smollm2' is the offline default model."""
    if name_or_path == DEFAULT_TARGET:
        from .smollm2 import load_smollm2

        target, tokenizer = load_smollm2(dtype=dtype)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        target = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).eval()
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if device:
        target.to(device)
    return target, tokenizer


def cmd_generate(args) -> None:
    from .modeling import DSparkDrafter
    from .trace import summarize
    from .training.data import render_prompt

    if args.target == DEFAULT_TARGET and args.drafter is None:
        from .default import load_default

        target, tokenizer, drafter = load_default()
    else:
        target, tokenizer = load_target(args.target)
        drafter = DSparkDrafter.from_pretrained(args.drafter, target)
    prompt_ids = torch.tensor([render_prompt(tokenizer, args.prompt)])
    sampling = dict(do_sample=True, temperature=args.temperature) if args.temperature > 0 else dict(do_sample=False)
    from transformers import TextStreamer

    output = target.generate(
        prompt_ids,
        attention_mask=torch.ones_like(prompt_ids),
        max_new_tokens=args.max_new_tokens,
        assistant_model=drafter,
        assistant_confidence_threshold=args.threshold,
        streamer=TextStreamer(tokenizer, skip_prompt=True),
        **sampling,
    )
    summary = summarize(drafter.last_trace)
    print(
        f"\n[dspark] {output.shape[1] - prompt_ids.shape[1]} tokens in {summary.rounds} rounds, "
        f"tau={summary.tau:.2f}, verify rate={summary.verify_rate:.2f}, "
        f"draft {summary.draft_seconds:.2f}s / verify {summary.verify_seconds:.2f}s",
        file=sys.stderr,
    )


def cmd_train(args) -> None:
    from .config import DSparkConfig, zlab_default_layer_ids
    from .training.data import load_sequences, read_prompts, regenerate, tokenize_texts
    from .training.trainer import TrainSettings, choose_mask_token, train

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill saves the last finished step too
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_target(args.target, device=args.device)
    torch.manual_seed(args.seed)

    if args.data:
        sequences = [r for path in args.data for r in load_sequences(path)]
    elif args.text:
        sequences = tokenize_texts(tokenizer, [Path(p).read_text() for p in args.text])
    else:
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
    )
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
    drafter.save_pretrained(out, include_shared_weights=args.include_shared_weights, dtype=dtype)
    print(json.dumps({"out": str(out), "steps": settings.max_steps, "sequences": len(sequences)}))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark", description="DSpark speculative decoding for transformers")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate with a drafter and print the round statistics")
    gen.add_argument("--target", default=DEFAULT_TARGET, help="Hub id or directory ('smollm2': offline default)")
    gen.add_argument("--drafter", default=None, help="Hub id or directory of a DSpark/DFlash checkpoint")
    gen.add_argument("--prompt", default="What is 17 * 23? Explain step by step.")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--threshold", type=float, default=0.0, help="assistant_confidence_threshold")
    gen.set_defaults(func=cmd_generate)

    tr = commands.add_parser("train", help="train a DSpark or DFlash drafter for a target")
    tr.add_argument("--target", required=True, help="Hub id or directory ('smollm2': offline default)")
    source = tr.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", nargs="+", help='jsonl files of {"turns": [...]}; the target regenerates answers')
    source.add_argument("--data", nargs="+", help="already regenerated jsonl (prompt_ids/response_ids records)")
    source.add_argument("--text", nargs="+", help="plain text files to train on as they are")
    tr.add_argument("--out", required=True)
    tr.add_argument("--arch", choices=["dspark", "dflash"], default="dspark")
    tr.add_argument("--block-size", type=int, default=7)
    tr.add_argument("--layers", type=int, default=1, help="draft decoder layers")
    tr.add_argument("--markov-rank", type=int, default=64)
    tr.add_argument("--markov-head", choices=["vanilla", "gated", "rnn"], default="vanilla")
    tr.add_argument("--target-layer-ids", type=int, nargs="+", default=None)
    tr.add_argument("--num-target-features", type=int, default=4, help="layers read when ids are not given")
    tr.add_argument("--mask-token-id", type=int, default=None)
    tr.add_argument("--max-steps", type=int, default=1000)
    tr.add_argument("--batch-size", type=int, default=4, help="sequences per optimizer step")
    tr.add_argument("--anchors", type=int, default=32, help="anchors (blocks) per sequence")
    tr.add_argument("--max-tokens", type=int, default=768, help="tokens per training sequence")
    tr.add_argument("--lr", type=float, default=6e-4)
    tr.add_argument("--warmup-steps", type=int, default=50)
    tr.add_argument(
        "--loss-vocab",
        choices=["full", "responses"],
        default="full",
        help="'responses': the loss scores only tokens seen in the training answers (several times cheaper on CPU)",
    )
    tr.add_argument("--save-every", type=int, default=100)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--max-prompts", type=int, default=None)
    tr.add_argument("--max-new-tokens", type=int, default=256, help="regenerated response length")
    tr.add_argument("--regen-batch-size", type=int, default=16)
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

    from . import bench, demo_app

    bench.add_arguments(commands.add_parser("bench", help="tau and tokens/s against the baselines"))
    demo_app.add_arguments(commands.add_parser("demo", help="Gradio demo: watch every drafting round"))
    from . import calibration

    calibration.add_arguments(
        commands.add_parser("calibrate", help="fit STS confidence temperatures (and re-profile the cost table)")
    )
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
