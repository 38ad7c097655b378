"""DSpark speculative decoding for Hugging Face transformers.

    drafter = DSparkDrafter.from_pretrained("deepseek-ai/dspark_qwen3_4b_block7", target)
    target.generate(**inputs, assistant_model=drafter)

Layers, imports pointing down: `core` (what generate() needs) <- `formats` (checkpoint
layouts and the loader) <- `tools` (CLI, bench, calibrate, demo, training, default pair).
"""

from .core.config import CheckpointError, DSparkConfig
from .core.generation import DSparkCandidateGenerator
from .core.trace import RoundRecord, TraceSummary, summarize
from .formats.loader import DSparkDrafter
from .tools.targets import load_default

__all__ = [
    "CheckpointError",
    "DSparkCandidateGenerator",
    "DSparkConfig",
    "DSparkDrafter",
    "RoundRecord",
    "TraceSummary",
    "load_default",
    "summarize",
]
__version__ = "0.1.0"
