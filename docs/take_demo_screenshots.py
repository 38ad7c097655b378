"""Screenshots of `dspark demo` for the README, taken in headless Chromium.

    python docs/take_demo_screenshots.py                    # SmolLM2 + the shipped drafter, into docs/
    python docs/take_demo_screenshots.py --target DIR --drafter DIR --dtype float32 --out /tmp/shots

Serves the demo on a free 127.0.0.1 port, as `dspark demo` would, and saves:
  demo.png            the page's defaults: a greedy answer to the default prompt (the README's)
  demo-rounds.png     the same answer with the rounds table open
  demo-threshold.png  the threshold scheduler at 0.5
  demo-sampling.png   temperature 1
  demo-empty.png      an empty prompt
  demo-stop.png       a long answer stopped after a few rounds
Each run waits for the target-alone run too, so the speed-up is on the page. On a busy CPU
the timings (not the answer) suffer: take them on an idle machine. Needs the demo and test
extras (Gradio, Playwright) and a Chromium: --chromium, or the one scripts/setup_browser.sh finds or installs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys

from dspark_hf.tools.demo import build_demo, serve_in_background
from dspark_hf.tools.options import add_model_arguments, load_pair_from_args

RUN_SECONDS = 900  # the longest a generation (both runs) may take on a slow CPU


def set_number(page, label: str, value: float) -> None:
    box = page.get_by_role("spinbutton", name=f"number input for {label}")
    box.fill(f"{value:g}")
    box.press("Tab")


def shoot(page, out: pathlib.Path, name: str) -> None:
    path = out / name
    page.screenshot(path=str(path), full_page=True)
    print(path, flush=True)


def generate(page) -> None:
    """Click Generate and wait for both runs to end."""
    from playwright.sync_api import expect

    page.locator("#dspark-generate").click()
    expect(page.locator("#dspark-generate")).to_be_disabled()
    expect(page.locator("#dspark-generate")).to_be_enabled(timeout=RUN_SECONDS * 1000)


def take(url: str, out: pathlib.Path, chromium: str, max_new_tokens: int) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        rounds = page.get_by_text("Rounds: what was drafted, kept, rejected and pruned")
        set_number(page, "Max new tokens", max_new_tokens)

        generate(page)
        shoot(page, out, "demo.png")
        rounds.click()
        shoot(page, out, "demo-rounds.png")
        rounds.click()

        page.get_by_label("threshold", exact=True).check()
        set_number(page, "Confidence threshold", 0.5)
        generate(page)
        shoot(page, out, "demo-threshold.png")

        page.reload()
        set_number(page, "Max new tokens", max_new_tokens)
        set_number(page, "Temperature (0 = greedy)", 1)
        generate(page)
        shoot(page, out, "demo-sampling.png")

        page.reload()
        page.get_by_label("Prompt (a user chat turn)").fill("")
        page.locator("#dspark-generate").click()
        expect(page.get_by_text("Type a prompt first")).to_be_visible()
        shoot(page, out, "demo-empty.png")

        page.reload()
        set_number(page, "Max new tokens", 512)
        page.locator("#dspark-generate").click()
        expect(page.locator("#dspark-answer .tok").nth(24)).to_be_attached(timeout=RUN_SECONDS * 1000)
        page.locator("#dspark-stop").click()
        # "done" when a fast (tiny) model finished before the click landed
        expect(page.locator("#dspark-status")).to_contain_text(re.compile("stopped|done"), timeout=RUN_SECONDS * 1000)
        expect(page.locator("#dspark-generate")).to_be_enabled()
        shoot(page, out, "demo-stop.png")
        browser.close()


def setup_browser() -> str:
    """The Chromium scripts/setup_browser.sh finds, or installs where it can; its one line of why not otherwise."""
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "setup_browser.sh"
    environ = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=environ)
    if result.returncode != 0:
        sys.exit(result.stderr.strip().splitlines()[-1])
    return result.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).parent, help="where the PNGs go")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length of the screenshots' runs")
    parser.add_argument("--chromium", default=None, help="unset: the one scripts/setup_browser.sh finds or installs")
    args = parser.parse_args()
    chromium = args.chromium or setup_browser()
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    args.out.mkdir(parents=True, exist_ok=True)
    demo = build_demo(*load_pair_from_args(args))
    url = serve_in_background(demo)
    try:
        take(url, args.out, chromium, args.max_new_tokens)
    finally:
        demo.close()


if __name__ == "__main__":
    main()
