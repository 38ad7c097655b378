"""Function-stub prompts (a signature and its docstring, to complete), built from the target's own code answers.

    python scripts/stub_prompts.py --count 4096 --out data/smollm2/stub_prompts.jsonl.gz
    python scripts/stub_prompts.py --count 256 --held-out --out data/smollm2/stub_heldout_prompts.jsonl.gz

Why: humaneval asks for the body of a stub handed over in a fenced block, and the answer restates that stub before
writing the body. None of the training prompts has that form (lbpp and livecodebench describe a task in prose), and
the target's own code answers almost never carry a docstring (4 in 2,000), so the drafter had not read answers of
that shape. A stub here takes the signature of the first top-level function the target wrote in a fenced block,
answering one of its own code prompts (`dspark synthesize`, a training prompt: `prompt_index % 20 != 19`), and that
prompt's first paragraph as its docstring, under one of a few instruction lines of this script's own (not the dev
set's). Stubs close to a dev prompt (shared word trigrams) and repeated ones are dropped. Deterministic; the file is
cut to whole shards of `--shard-size`, as `dspark regenerate` finishes a short last shard only once more prompts
fill it.
"""

import argparse
import ast
import json
import re
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_splits import MAGPIE_PROMPTS, magpie_answers  # noqa: E402  (sibling scripts: the held-out rule,
from vary_prompts import write_whole_shards  # noqa: E402  and the prompt file cut to whole shards)

from dspark_hf.tools.prompts import read_prompts, shipped_prompt_sets
from dspark_hf.tools.training.data import read_jsonl
from dspark_hf.tools.training.synthesize import PromptFilter

INSTRUCTIONS = (
    "Complete the following Python function.",
    "Write the body of this Python function so that it does what its docstring says.",
    "Implement the function below in Python.",
    "Finish this Python function:",
)
FENCE = re.compile(r"```(?:python|py)?\n(.*?)```", re.DOTALL)
DEF = re.compile(r"\bdef (\w+)\(")


def signature(answer: str):
    """(import lines, `def ...:` lines) of the first top-level function with arguments in a fenced block, or None."""
    for block in FENCE.findall(answer):
        try:
            tree = ast.parse(block)
        except (SyntaxError, ValueError):
            continue
        lines = block.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.args.args:
                imports = [ast.get_source_segment(block, n) for n in tree.body
                           if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno < node.lineno]
                first = node.body[0]  # the header ends where the body starts, decorators of an inner function included
                body_line = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
                header = "\n".join(lines[node.lineno - 1: body_line - 1]).rstrip()
                return (imports, header) if header else None  # `def f(x): return x` has no header line to itself
    return None


def docstring(prompt: str):
    """The prompt's first paragraph as a docstring body, or None where it holds code, is cut off before what it
    introduces (a trailing colon) or is too long for one."""
    first = prompt.strip().split("\n\n")[0].strip()
    if "```" in first or '"""' in first or first.endswith(":") or not 20 <= len(first) <= 400:
        return None
    return textwrap.fill(" ".join(first.split()), width=84, initial_indent="    ", subsequent_indent="    ")


def stub_prompt(instruction: str, imports: list[str], signature_lines: str, doc: str) -> str:
    code = "\n".join(imports + [""] * bool(imports) + [signature_lines, f'    """\n{doc}\n    """'])
    return f"{instruction}\n```python\n{code}\n```"


def parses(text: str) -> bool:
    """Whether the stub's code is Python whose last function holds its docstring alone (a header cut short, such as
    a one-line `def f(x): return x`, is not)."""
    try:
        function = ast.parse(text.split("```python\n", 1)[1].removesuffix("```")).body[-1]
    except (SyntaxError, IndexError):
        return False
    return isinstance(function, ast.FunctionDef) and len(function.body) == 1 and bool(ast.get_docstring(function))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, required=True, help="stubs to write at most (cut to whole shards)")
    parser.add_argument("--shard-size", type=int, default=256, help="the answer shards' size (keep whole shards)")
    parser.add_argument("--out", type=Path, required=True, help="jsonl(.gz) of {turns, kind, source, origin}")
    parser.add_argument("--held-out", action="store_true",
                        help="build them from the held-out answers instead (`prompt_index % 20 == 19`): stubs to "
                             "measure τ on, never trained on")
    args = parser.parse_args()
    from dspark_hf.tools.targets import load_smollm2

    _, tokenizer = load_smollm2()
    prompts = read_jsonl(MAGPIE_PROMPTS)
    dev = [prompt for path in shipped_prompt_sets().values() for prompt in read_prompts([path])]
    keep = PromptFilter(dev, kept=[])
    dev_names = {name for prompt in dev for name in DEF.findall(prompt)}  # a dev function's name is left to dev
    records, dropped = [], {"no function": 0, "no docstring": 0, "filtered": 0}
    for answer in magpie_answers():
        if answer["kind"] != "magpie-code" or (answer["prompt_index"] % 20 == 19) != args.held_out:
            continue
        found = signature(tokenizer.decode(answer["response_ids"], skip_special_tokens=True))
        doc = docstring(prompts[answer["prompt_index"]]["turns"][0])
        if found is None or doc is None:
            dropped["no function" if found is None else "no docstring"] += 1
            continue
        text = stub_prompt(INSTRUCTIONS[len(records) % len(INSTRUCTIONS)], *found, doc)
        if not parses(text) or keep.reason(text, complete=True) or DEF.search(found[1]).group(1) in dev_names:
            dropped["filtered"] += 1
            continue
        records.append({"turns": [text], "kind": "code", "source": "stub", "origin": answer["prompt_index"]})
        if len(records) == args.count:
            break
    kept = write_whole_shards(args.out, records, args.shard_size)
    print(json.dumps({"out": str(args.out), "stubs": kept, "dropped": dropped}))


if __name__ == "__main__":
    main()
