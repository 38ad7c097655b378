"""The Gradio app and `dspark demo`: controls, the one generation at a time, serving on 127.0.0.1.

Gradio is imported only when the demo is built: it is an optional extra (`pip install
dspark_hf[demo]`), and `dspark` imports this module for every command.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from typing import TYPE_CHECKING

from ..errors import InputError, port_number
from ..options import (
    add_compile_argument,
    add_model_arguments,
    compile_before_the_clock,
    compiled_target_kwargs,
    load_pair_from_args,
)
from ..prompts import render_prompt
from .render import OUTPUT_LABELS, confidence_label, legend_html, models_markdown, outputs
from .state import FULL_BLOCK, SCHEDULER_CHOICES, LiveRun, Settings
from .worker import WORKER_THREAD_NAME, drain, generate_both

if TYPE_CHECKING:
    import gradio as gr

DEFAULT_MAX_NEW_TOKENS = 128
MAX_PROMPT_TOKENS = 2048  # longer prompts are refused: on a CPU their prefill alone would take minutes
DEFAULT_PORT = 7860
# The README's prompt too: SmolLM2-135M answers it correctly in fp32 and bf16, drafted and alone, while it gets
# arithmetic word problems wrong.
DEFAULT_PROMPT = "Write a Python function that reverses a string. Reply with the code only."


class DemoSession:
    """The models, and the one generation the app runs at a time (its Stop button ends the latest)."""

    def __init__(self, target, tokenizer, drafter, compiled: dict | None = None):
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.compiled = compiled or {}  # generate() fields that compile the target (--compile), for both runs
        self.stop_event = threading.Event()

    def stop(self) -> None:
        self.stop_event.set()

    def prompt_info(self, prompt: str) -> str:
        """The prompt's size as the model sees it (chat template included), and the limit."""
        if not prompt.strip():
            return "Type a prompt to start."
        count = len(render_prompt(self.tokenizer, prompt))
        if count > MAX_PROMPT_TOKENS:
            return f"**{count} prompt tokens: over this demo's limit of {MAX_PROMPT_TOKENS}.** Shorten the prompt."
        return f"{count} prompt tokens, chat template included (limit {MAX_PROMPT_TOKENS})."

    def generate(
        self, prompt, max_new_tokens, scheduler, threshold, block_cap, temperature, compare_plain, ngram=True
    ):
        """Yields the page outputs as rounds (and target-alone tokens) arrive, until both runs end."""
        import gradio as gr

        if not prompt or not prompt.strip():
            raise gr.Error("Type a prompt first: the prompt box is empty.", print_exception=False)
        prompt_ids = render_prompt(self.tokenizer, prompt)
        if len(prompt_ids) > MAX_PROMPT_TOKENS:
            raise gr.Error(
                f"The prompt is {len(prompt_ids)} tokens; this demo takes at most {MAX_PROMPT_TOKENS}. Shorten it.",
                print_exception=False,
            )
        settings = Settings(
            int(max_new_tokens),
            str(scheduler),
            float(threshold),
            int(block_cap),
            float(temperature),
            bool(compare_plain),
            bool(ngram),
        )
        stop = self.stop_event = threading.Event()
        events: queue.Queue = queue.Queue()
        worker = threading.Thread(
            target=generate_both,
            args=(self.target, self.drafter, prompt_ids, settings, events, stop, self.compiled),
            name=WORKER_THREAD_NAME,
            daemon=True,
        )
        run = LiveRun(self.tokenizer, prompt_ids, settings, calibrated=self.drafter.calibration is not None)
        worker.start()
        try:
            yield outputs(run)
            while not run.finished:
                for kind, payload in drain(events):
                    if kind == "error":
                        raise gr.Error(f"generation failed: {payload!r}")
                    run.apply(kind, payload)
                yield outputs(run)
        finally:
            stop.set()  # the page went away or failed: end the worker too
            worker.join()


def build_demo(target, tokenizer, drafter, compiled: dict | None = None) -> "gr.Blocks":
    """The Blocks app for a target, its tokenizer and a DSparkDrafter loaded for that target; `compiled`: the
    generate() fields of a compiled target, for both runs."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    import gradio as gr

    session = DemoSession(target, tokenizer, drafter, compiled)
    defaults = drafter.generation_config  # the settings generate() uses when given none
    most_drafts = drafter.config.num_draft_tokens
    with gr.Blocks(title="DSpark speculative decoding", analytics_enabled=False) as demo:
        gr.Markdown(
            "## DSpark speculative decoding\n"
            "A small drafter proposes a block of tokens; the scheduler sends a prefix of it to the target, "
            "which keeps the drafts it agrees with and adds one token of its own. The answer is the target's: "
            "drafting only makes it faster."
        )
        gr.Markdown(models_markdown(target, drafter), elem_id="dspark-models")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                prompt = gr.Textbox(
                    label="Prompt (a user chat turn)", lines=5, value=DEFAULT_PROMPT, elem_id="dspark-prompt"
                )
                prompt_count = gr.Markdown(elem_id="dspark-prompt-count")
                with gr.Row():
                    generate_button = gr.Button("Generate", variant="primary", elem_id="dspark-generate")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="dspark-stop")
                max_new_tokens = gr.Slider(1, 512, value=DEFAULT_MAX_NEW_TOKENS, step=1, label="Max new tokens")
                scheduler = gr.Radio(
                    list(SCHEDULER_CHOICES),
                    value=defaults.dspark_scheduler,
                    label="Scheduler",
                    info="auto: cost on CPUs, threshold where a block verifies as fast as one token; "
                    "full block: send every draft (threshold 0)",
                )
                threshold = gr.Slider(
                    0.0,
                    1.0,
                    value=float(defaults.assistant_confidence_threshold or 0.0),
                    step=0.05,
                    label="Confidence threshold",
                    info="send drafts up to the first confidence below this (0: no cut)",
                )
                block_cap = gr.Slider(
                    1,
                    most_drafts,
                    value=int(defaults.num_assistant_tokens),
                    step=1,
                    label="Block cap (most drafts sent per round)",
                )
                temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                compare_plain = gr.Checkbox(
                    value=True, label="Also run the target alone (checks the answer, measures the speed-up)"
                )
                ngram = gr.Checkbox(
                    value=bool(getattr(defaults, "dspark_ngram", True)),
                    label="Hybrid drafting: a round may propose an n-gram found in the context instead",
                )
            with gr.Column(scale=2):
                status = gr.Markdown(label=OUTPUT_LABELS[2], elem_id="dspark-status")
                gr.HTML(legend_html(confidence_label(drafter.calibration is not None)))
                answer_view = gr.HTML(label=OUTPUT_LABELS[0], elem_id="dspark-answer")
                metrics = gr.HTML(label=OUTPUT_LABELS[3], elem_id="dspark-metrics")
                chart = gr.HTML(label=OUTPUT_LABELS[4], elem_id="dspark-chart")
                with gr.Accordion("Rounds: what was drafted, kept, rejected and pruned", open=False):
                    rounds = gr.HTML(label=OUTPUT_LABELS[5], elem_id="dspark-rounds")
                with gr.Accordion("Plain text and data", open=False):
                    answer_text = gr.Textbox(
                        label=OUTPUT_LABELS[1], lines=6, interactive=False, elem_id="dspark-answer-text"
                    )
                    plain_text = gr.Textbox(label=OUTPUT_LABELS[6], lines=6, interactive=False, elem_id="dspark-plain")
                    details = gr.JSON(label=OUTPUT_LABELS[7])
        ui_only = dict(queue=False, api_visibility="private", show_progress="hidden")
        demo.load(session.prompt_info, prompt, prompt_count, **ui_only)
        prompt.change(session.prompt_info, prompt, prompt_count, trigger_mode="always_last", **ui_only)
        scheduler.change(lambda choice: gr.Slider(interactive=choice != FULL_BLOCK), scheduler, threshold, **ui_only)
        # Busy state: the button is disabled while a run is on (and for its queue wait), then given back;
        # Gradio's `then` does not follow a failed event (an empty prompt), hence `failure` too.
        generation = generate_button.click(
            lambda: gr.Button("Generating…", interactive=False), None, generate_button, **ui_only
        ).then(
            session.generate,
            inputs=[prompt, max_new_tokens, scheduler, threshold, block_cap, temperature, compare_plain, ngram],
            outputs=[answer_view, answer_text, status, metrics, chart, rounds, plain_text, details],
            api_name="generate",
            show_progress="hidden",
            concurrency_limit=1,
        )
        for after in (generation.then, generation.failure):
            after(lambda: gr.Button("Generate", interactive=True), None, generate_button, **ui_only)
        stop_button.click(session.stop, api_name="stop", queue=False)
    return demo


# ---------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="serve on 127.0.0.1 at this port")
    add_compile_argument(parser)
    parser.set_defaults(func=run)


def port_in_use(port: int) -> InputError:
    return InputError(
        f"port {port} on 127.0.0.1 is in use (another demo?); pick a free one with --port, e.g. --port {port + 1}."
    )


def check_port_free(port: int) -> None:
    """Fail in one line before the models load, rather than with Gradio's traceback after."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise port_in_use(port) from None


def serve_in_background(demo) -> str:
    """Serve built Blocks on a free local port without blocking (tests, screenshots); returns the URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo.launch(
        server_name="127.0.0.1", server_port=port, share=False, ssr_mode=False, prevent_thread_lock=True, quiet=True
    )
    return demo.local_url


def run(args) -> None:
    """Serve the demo on 127.0.0.1:<port>, never shared, until Ctrl-C.

    Gradio's own banner is silenced (`quiet`): it suggests `share=True`, which this demo never uses."""
    check_port_free(args.port)
    target, tokenizer, drafter = load_pair_from_args(args)
    compiled = compiled_target_kwargs() if args.compile else {}
    if compiled:  # both runs' lengths compile now, not inside the first timed answer
        prompt_ids = render_prompt(tokenizer, DEFAULT_PROMPT)
        for assistant in ({"assistant_model": drafter}, {}):
            compile_before_the_clock(target, prompt_ids, "dspark demo", max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
                                     do_sample=False, **assistant, **compiled)
    demo = build_demo(target, tokenizer, drafter, compiled)
    try:
        demo.launch(
            server_name="127.0.0.1", server_port=args.port, share=False, ssr_mode=False, quiet=True,
            prevent_thread_lock=True,
        )
    except OSError as error:  # taken while the models loaded
        if "port" not in str(error):
            raise
        raise port_in_use(args.port) from None
    print(f"dspark demo: running on {demo.local_url} (Ctrl-C stops it)", flush=True)
    demo.block_thread()
