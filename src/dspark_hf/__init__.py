"""DSpark speculative decoding for Hugging Face transformers.

    drafter = DSparkDrafter.from_pretrained("deepseek-ai/dspark_qwen3_4b_block7", target)
    target.generate(**inputs, assistant_model=drafter)

Layers, imports pointing down: `core` (what generate() needs) <- `formats` (checkpoint
layouts and the loader) <- `tools` (CLI, bench, calibrate, demo, training, default pair).
"""

import importlib

# Each name and the module that defines it: imported on first use, so that `import dspark_hf` loads no
# tool (and a console command that needs neither torch nor transformers, such as `dspark --help`, loads neither).
EXPORTS = {
    "CheckpointError": ".core.config",
    "DSparkCandidateGenerator": ".core.generation",
    "DSparkConfig": ".core.config",
    "DSparkDrafter": ".formats.loader",
    "RoundRecord": ".core.trace",
    "TraceSummary": ".core.trace",
    "load_default": ".tools.targets",
    "summarize": ".core.trace",
}
__all__ = sorted(EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'dspark_hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
